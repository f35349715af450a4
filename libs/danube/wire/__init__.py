"""The contracts between the mesh's parts: what crosses a process boundary.

- Danube's client protocol, the gRPC wire contract (``DanubeApi.proto``,
  ``SchemaRegistry.proto``) and the message classes generated from it. The ``*_pb2.py`` /
  ``*_pb2.pyi`` modules are generated (``make proto``, i.e. ``python -m danube.wire.generate``)
  and committed; a unit test regenerates them and fails when they drift from the ``.proto``
  files. Service stubs are not generated: the gRPC doors bind their handlers themselves
  (danube.grpc_door.server), tests call methods by path.
- The services' bus contracts, one package per service that answers requests: its bodies,
  status codes and the client its callers use: ``danube.wire.ingest`` (produce, WAL fetch,
  replication), ``danube.wire.dispatcher`` (subscriptions and their refusals),
  ``danube.wire.cloud`` (the cloud reader), and ``danube.wire.limits`` (the policy limits a
  produce carries to a partition's leader, and backlog arithmetic).
- The public HTTP API's answers, ``danube.wire.api``: discovery's doors answer them and the
  SDK reads them (subclassing them where a client must tolerate more), one definition each;
  the bodies of consuming, ``danube.wire.consume``, likewise for discovery and a dispatcher's
  consume door.
- What they share: ``danube.wire.errors`` (``BadRequestError``, the one error of a body that
  breaks its layout) and ``danube.wire.claim`` (the claim-and-retry request loop of the
  clients). Errors carry codes and kinds (danube.errors.ErrorKind), not statuses: each door
  answers a kind with its own; ``danube.wire.codes`` spells the client API's shared codes.

A service imports the libs and itself only, never another service
(tests/unit/test_service_imports.py): what two services share lives here.
"""
