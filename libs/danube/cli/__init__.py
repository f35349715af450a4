"""The `danube` command line."""

import os

# `danube up` starts servers and services (fork, then exec) while this process may have gRPC
# calls to etcd under way (the secured mesh's etcd setup). gRPC's fork handlers then restart
# its poller thread in the child, which closes every descriptor before exec: the child dies
# of SIGABRT ("epoll_wait error: Bad file descriptor"), about one start in five under load.
# The children exec at once and need nothing of gRPC from here, so the handlers are off.
# gRPC reads this when it is imported: it must be set before that, here.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
