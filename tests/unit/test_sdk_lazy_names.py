"""`danube.client` imports its public names on first use: every name of ``__all__`` has a
home module that defines it, and importing the package loads none of them."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

import danube.client as sdk

pytestmark = pytest.mark.unit


def test_every_public_name_has_its_home_and_no_other_name_does() -> None:
    assert set(sdk._HOMES) == set(sdk.__all__)
    for name, home in sdk._HOMES.items():
        assert getattr(sdk, name) is getattr(importlib.import_module(home), name), name


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        sdk.Nope  # noqa: B018


def test_importing_the_package_loads_no_module_of_it() -> None:
    script = (
        "import json, sys; import danube.client; "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('danube.client.'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(done.stdout) == []
