"""`danube bench`: throughput and latency of a running mesh, measured through the SDK
(docs/cli.md, "danube bench"). A tool beside the product, not part of it:

- :mod:`danube.bench.app`: the `danube bench produce|consume|e2e|grpc` commands (a typer
  app; progress on stderr, a table or ``--json`` on stdout);
- :mod:`danube.bench.run`: the runs themselves (produce, consume, end to end) with no
  terminal I/O, also driven by tests/bench;
- :mod:`danube.bench.grpc_compare`: Danube's gRPC API against the HTTP API, one message per
  call (`danube bench grpc`).

The package leans on the CLI's shared helpers (``danube.cli._common``: the server option,
TLS, the consoles, running a command); the CLI knows it only through ``danube.cli.main``,
which loads :mod:`danube.bench.app` when a command line names `bench` (so `danube --help`
and the other commands never load it). No other product module imports it
(tests/unit/test_bench_imports.py).
"""
