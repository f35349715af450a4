"""A network of the test's own making on this machine: one network namespace per host, each
joined by a veth pair to a bridge in the root namespace (the hub, where the test and its load
generator run), addresses on a private /24 that clashes with nothing configured here. Faults
are nftables rules inside a host's namespace: a cut drops every packet to and from the named
peers, a loss drops a random share of them. Everything is deleted when the lab closes, also
after a failure.

Needs root (``ip netns add``); :func:`unavailable_reason` says why a lab cannot be made here,
:func:`missing_tools` which commands are not installed.
The kernel of this machine has no ``netem`` qdisc (no delay from ``tc``): delay comes from
``tests/netdelay.py``, a relay in the host's namespace (see docs/chaos.md).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import secrets
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

HUB = "hub"  # the root namespace's end of the bridge: the test process and its load
TABLE = "dnbfault"  # the nftables table (family inet) a host's faults live in
SUBNET_SECOND_OCTET = 77  # 10.77.x.0/24, x picked among those unused here
COMMAND_TIMEOUT_S = 10.0


class LabError(RuntimeError):
    """A command that builds or changes the lab failed."""


def run(argv: Sequence[str], *, stdin: str | None = None) -> str:
    """Run one command of the lab; its stderr is in the error when it fails."""
    try:
        done = subprocess.run(
            list(argv),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LabError(f"{' '.join(argv)}: {exc}") from exc
    if done.returncode != 0:
        raise LabError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def missing_tools() -> list[str]:
    """The commands a lab needs that are not installed (`make setup-net` installs them)."""
    return [tool for tool in ("ip", "nft") if shutil.which(tool) is None]


def unavailable_reason() -> str | None:
    """Why no lab may be made here (not root, or namespaces refused), or None when one
    may: a throwaway namespace is added and deleted to find out. Needs ``ip``."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add); running as a normal user"
    probe = f"dnbprobe{secrets.token_hex(3)}"
    try:
        run(["ip", "netns", "add", probe])
    except LabError as exc:
        return f"ip netns add is not permitted here: {exc}"
    with contextlib.suppress(LabError):
        run(["ip", "netns", "del", probe])
    return None


def free_subnet(rng: random.Random | None = None) -> ipaddress.IPv4Network:
    """A 10.77.x.0/24 that no address or route on this machine falls in."""
    used = run(["ip", "-4", "-o", "addr", "show"]) + run(["ip", "-4", "route", "show"])
    choices = list(range(1, 255))
    (rng or random.Random()).shuffle(choices)
    for third in choices:
        net = ipaddress.IPv4Network(f"10.{SUBNET_SECOND_OCTET}.{third}.0/24")
        if f"10.{SUBNET_SECOND_OCTET}.{third}." not in used:
            return net
    raise LabError(f"no free 10.{SUBNET_SECOND_OCTET}.x.0/24 on this machine")


@dataclass(frozen=True)
class Fault:
    """What a host's namespace does to its traffic with ``peers``: drop all of it (``cut``)
    or ``loss_percent`` of it at random; ``peers`` empty: with everyone (loopback excepted)."""

    peers: frozenset[str]
    loss_percent: int = 100

    @property
    def cut(self) -> bool:
        return self.loss_percent >= 100


@dataclass
class Host:
    """One namespace: its name, its address on the lab's subnet, its root-side veth."""

    name: str
    netns: str
    address: str
    veth: str

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.netns, *argv]


@dataclass
class Lab:
    """The bridge, the hosts, and the faults in force per host. Use as a context manager
    (or call :meth:`close`): every namespace, veth and the bridge go at the end."""

    tag: str = field(default_factory=lambda: secrets.token_hex(2))
    subnet: ipaddress.IPv4Network | None = None
    hosts: dict[str, Host] = field(default_factory=dict)
    faults: dict[str, list[Fault]] = field(default_factory=dict)
    _bridge_made: bool = False

    @property
    def bridge(self) -> str:
        return f"dnf{self.tag}br"

    @property
    def hub_address(self) -> str:
        assert self.subnet is not None
        return str(self.subnet.network_address + 1)

    def open(self) -> Lab:
        """Make the bridge with the hub's address on it."""
        self.subnet = self.subnet or free_subnet()
        run(["ip", "link", "add", self.bridge, "type", "bridge"])
        self._bridge_made = True
        run(["ip", "addr", "add", f"{self.hub_address}/24", "dev", self.bridge])
        run(["ip", "link", "set", self.bridge, "up"])
        return self

    def add_host(self, name: str) -> Host:
        """A new namespace on the bridge, with the next address of the subnet."""
        assert self.subnet is not None, "open() the lab first"
        index = len(self.hosts) + 2  # .1 is the hub
        host = Host(
            name,
            netns=f"dnf{self.tag}-{name}",
            address=str(self.subnet.network_address + index),
            veth=f"dnf{self.tag}v{index}",
        )
        self.hosts[name] = host  # before it exists, so close() deletes a half-made host
        run(["ip", "netns", "add", host.netns])
        veth = ["ip", "link", "add", host.veth, "type", "veth"]
        run([*veth, "peer", "name", "eth0", "netns", host.netns])
        run(["ip", "link", "set", host.veth, "master", self.bridge, "up"])
        run(["ip", "-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0"])
        run(["ip", "-n", host.netns, "link", "set", "eth0", "up"])
        run(["ip", "-n", host.netns, "link", "set", "lo", "up"])
        return host

    def address(self, name: str) -> str:
        """A host's address; ``HUB`` is the root namespace's."""
        return self.hub_address if name == HUB else self.hosts[name].address

    # --- faults -----------------------------------------------------------------------

    def cut(self, host: str, peers: Iterable[str] = ()) -> None:
        """Drop everything between ``host`` and ``peers`` (all of its traffic when empty)."""
        self._add(host, Fault(frozenset(peers)))

    def loss(self, host: str, percent: int, peers: Iterable[str] = ()) -> None:
        """Drop ``percent`` % of the packets between ``host`` and ``peers``, at random."""
        if not 0 < percent < 100:
            raise ValueError(f"loss percent must be 1..99, got {percent}")
        self._add(host, Fault(frozenset(peers), percent))

    def heal(self, host: str | None = None) -> None:
        """Lift every fault of ``host`` (of every host when None)."""
        for name in [host] if host is not None else list(self.faults):
            self.faults.pop(name, None)
            self._apply(name)

    def _add(self, host: str, fault: Fault) -> None:
        unknown = (fault.peers | {host}) - set(self.hosts) - {HUB}
        if unknown or host == HUB:
            raise ValueError(f"no such host: {sorted(unknown) or host}")
        self.faults.setdefault(host, []).append(fault)
        self._apply(host)

    def _apply(self, host: str) -> None:
        """Replace the host's table with its faults in one nft transaction."""
        ruleset = render_table([self.rule(f) for f in self.faults.get(host, [])])
        run(self.hosts[host].command(["nft", "-f", "-"]), stdin=ruleset)

    def rule(self, fault: Fault) -> tuple[str, str]:
        """(input match, output match) of one fault; the verdict is added by render_table."""
        drop = "" if fault.cut else f"numgen random mod 100 < {fault.loss_percent} "
        if not fault.peers:
            return f'iifname != "lo" {drop}', f'oifname != "lo" {drop}'
        peers = ", ".join(sorted(self.address(p) for p in fault.peers))
        return f"ip saddr {{ {peers} }} {drop}", f"ip daddr {{ {peers} }} {drop}"

    # --- teardown -----------------------------------------------------------------------

    def close(self) -> list[str]:
        """Delete every namespace (its veth and nft tables go with it) and the bridge;
        returns what could not be deleted (empty when all went)."""
        left: list[str] = []
        for host in self.hosts.values():
            for argv in (["ip", "netns", "del", host.netns], ["ip", "link", "del", host.veth]):
                with contextlib.suppress(LabError):
                    run(argv)
        if self._bridge_made:
            with contextlib.suppress(LabError):
                run(["ip", "link", "del", self.bridge])
        namespaces = run(["ip", "netns", "list"])
        links = run(["ip", "-o", "link", "show"])
        left += [h.netns for h in self.hosts.values() if h.netns in namespaces]
        left += [n for n in [self.bridge, *(h.veth for h in self.hosts.values())] if n in links]
        self.faults.clear()
        return left

    def __enter__(self) -> Lab:
        try:
            return self.open()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        left = self.close()
        if left:
            raise LabError(f"left behind: {left}")


def render_table(rules: Sequence[tuple[str, str]]) -> str:
    """An nft script that replaces table ``inet dnbfault`` with these (input, output)
    matches, each dropping what it matches; no rules: the table is just removed.
    ``add`` then ``delete`` makes the delete valid whether the table existed or not."""
    lines = [f"add table inet {TABLE}", f"delete table inet {TABLE}"]
    if rules:
        lines.append(f"table inet {TABLE} {{")
        for hook, index in (("input", 0), ("output", 1)):
            lines.append(f"  chain {hook} {{")
            lines.append(f"    type filter hook {hook} priority 0; policy accept;")
            lines += [f"    {rule[index]}drop" for rule in rules]
            lines.append("  }")
        lines.append("}")
    return "\n".join(lines) + "\n"
