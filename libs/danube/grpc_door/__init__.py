"""Danube's gRPC client API (DanubeApi.proto; DESIGN §10, docs/grpc-api.md) as every door
serves it — discovery's (any topic, over the bus) and each ingest leader's (the partitions
it leads, in place):

- :mod:`~danube.grpc_door.api`: the handlers, over a small backend a door fills in
  (lookup, topic config, topic creation or the leader check, the append), and
  :mod:`~danube.grpc_door.consumers`, ConsumerService over the dispatchers;
- :mod:`~danube.grpc_door.server`: the call wrappers (decoding, deadlines, trace ids, one
  error table) and the listener with its limits and TLS;
- :mod:`~danube.grpc_door.requests`, :mod:`~danube.grpc_door.status`,
  :mod:`~danube.grpc_door.auth`: what a request may hold, how an error is answered, who
  may call what;
- :mod:`~danube.grpc_door.clients`, :mod:`~danube.grpc_door.acks`: the producers and
  consumers a door made for its clients, and their acks, batched;
- :mod:`~danube.grpc_door.leaders`: where a lookup sends a client (etcd's owners and
  registrations).

Nothing here imports a service.
"""
