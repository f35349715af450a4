"""The answers of the public HTTP API (docs/http-api.md), one definition each: discovery's
doors answer them (their OpenAPI schemas are these models'), and the SDK
(:mod:`danube.client`) reads answers into subclasses of them that relax what a client must
tolerate (a field an older server leaves out, a value a newer server adds).

- :mod:`~danube.wire.api.catalog`: the cluster, namespaces, topics and their partitions
  (owner, offsets), lookups, partition moves and upload skips, a topic's subscriptions
  (cursors, backlog, consumers), seeks, skips and failure policies;
- :mod:`~danube.wire.api.producers`: producer sessions;
- :mod:`~danube.wire.api.elastic`: reassignments and drains;
- :mod:`~danube.wire.api.schemas`: the schema registry;
- :mod:`~danube.wire.api.security`: roles, bindings, API keys, tokens, who am I.

Answers are frozen and ignore fields they do not know. They hold the records they show as
they are stored (danube.meta.records, danube.meta.failure_policy), which load without the
etcd client: the SDK imports this package, so nothing here imports a server's machinery. A
collection of answers is a ``Sequence`` (a ``Mapping``) so that the SDK's subclass may
narrow it to its own answers."""
