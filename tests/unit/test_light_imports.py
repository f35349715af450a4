"""The values that cross the wire load light: the HTTP API's answers (``danube.wire.api``,
which the SDK reads) and the records they hold (``danube.meta.records``,
``danube.meta.failure_policy``) import no etcd client, gRPC, NATS, web framework or settings
loader; ``danube.meta``, ``danube.config`` and ``danube.security`` import each public name
from its home on first use."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from types import ModuleType

import pytest

import danube.config
import danube.meta
import danube.security

pytestmark = pytest.mark.unit

HEAVY = (
    "aetcd",
    "grpc",
    "nats",
    "google.protobuf",
    "fastapi",
    "danube.config.loader",
    "danube.security.tokens",
)


def _loaded_by(statement: str) -> list[str]:
    """The heavy modules that ``statement`` loads in a fresh interpreter."""
    script = (
        f"import json, sys; {statement}; "
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    return list(json.loads(done.stdout))


def test_the_answers_and_records_load_without_a_server_s_machinery() -> None:
    assert _loaded_by("import danube.meta.records, danube.meta.failure_policy") == []
    sdk = "import danube.client.admin, danube.client.schemas, danube.client.security"
    assert _loaded_by(sdk) == []


@pytest.mark.parametrize("package", [danube.meta, danube.config, danube.security])
def test_every_public_name_of_a_lazy_package_has_its_home(package: ModuleType) -> None:
    homes: dict[str, str] = vars(package)["_HOMES"]
    assert set(homes) == set(package.__all__)
    for name, home in homes.items():
        assert getattr(package, name) is getattr(importlib.import_module(home), name), name
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        package.Nope  # noqa: B018
