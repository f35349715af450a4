"""The network fault harness's lab (tests/netlab.py) on this machine: a host in its own
namespace reaches the hub over the bridge; a cut stops exactly the named link and a heal
restores it; isolation stops everything; the lab leaves no namespace, veth or bridge behind,
also when the block using it fails. Needs root (skipped otherwise, with the reason)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.netlab import Lab, LabError, missing_tools, run, unavailable_reason

pytestmark = pytest.mark.integration

CONNECT = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1)"


@pytest.fixture
def lab() -> Iterator[Lab]:
    if missing_tools():
        pytest.fail(f"{missing_tools()} not installed: `make setup-net` installs them")
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    made = Lab()
    try:
        made.open()
        yield made
    finally:
        assert made.close() == []


@pytest.fixture
def hub_listener(lab: Lab) -> Iterator[int]:
    """A TCP listener on the hub's address (the root namespace's end of the bridge)."""
    with socket.socket() as listener:
        listener.bind((lab.hub_address, 0))
        listener.listen(16)
        yield int(listener.getsockname()[1])


def _connects(lab: Lab, host: str, address: str, port: int) -> bool:
    argv = lab.hosts[host].command([sys.executable, "-c", CONNECT, address, str(port)])
    return subprocess.run(argv, capture_output=True, timeout=10, check=False).returncode == 0


def test_cut_heal_and_isolate(lab: Lab, hub_listener: int) -> None:
    lab.add_host("a")
    lab.add_host("b")
    hub = lab.hub_address
    assert _connects(lab, "a", hub, hub_listener)
    assert _connects(lab, "b", hub, hub_listener)
    lab.cut("a", ["b"])  # another link: the hub stays reachable
    assert _connects(lab, "a", hub, hub_listener)
    lab.cut("a", ["hub"])
    assert not _connects(lab, "a", hub, hub_listener)
    assert _connects(lab, "b", hub, hub_listener)
    lab.heal("a")
    assert _connects(lab, "a", hub, hub_listener)
    lab.cut("b")  # no peers: isolated
    assert not _connects(lab, "b", hub, hub_listener)
    lab.heal()
    assert _connects(lab, "b", hub, hub_listener)
    assert "dnbfault" not in run(lab.hosts["b"].command(["nft", "list", "tables"]))


def test_a_failing_block_leaves_nothing_behind() -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    lab = Lab()

    def fail_inside() -> None:
        with lab:
            lab.add_host("x")
            lab.cut("x")
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fail_inside()
    assert lab.hosts["x"].netns not in run(["ip", "netns", "list"])
    links = run(["ip", "-o", "link", "show"])
    assert lab.bridge not in links
    assert lab.hosts["x"].veth not in links
    with pytest.raises(LabError):  # and the bridge is really gone
        run(["ip", "link", "show", lab.bridge])
