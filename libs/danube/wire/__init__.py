"""Danube's client protocol: the gRPC wire contract (``DanubeApi.proto``,
``SchemaRegistry.proto``) and the message classes generated from it.

The ``*_pb2.py`` / ``*_pb2.pyi`` modules are generated (``make proto``, i.e.
``python -m danube.wire.generate``) and committed; a unit test regenerates them and fails
when they drift from the ``.proto`` files. Service stubs are not generated: the front door
binds its handlers itself (danube.discovery.grpc_api), tests call methods by path.
"""
