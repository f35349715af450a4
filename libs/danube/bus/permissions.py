"""Who may publish and subscribe what on the bus: the one table, per service kind.

A secured mesh (``danube up --secure``, docs/security.md) gives every service kind a NATS
user of its own, and nats-server enforces the table below, so a compromised or buggy
service reaches only the subjects its kind needs. The nats-server configuration is
generated from :func:`bus_permissions`; nothing else lists subjects per kind.

Per kind, two sets of subject kinds (:class:`~danube.bus.subjects.Kind`):

- ``publish``: what it publishes or sends requests to;
- ``subscribe``: what it subscribes to or serves (queue groups included).

Replies never need a ``publish`` entry: every user has ``allow_responses`` (the server
lets a subscriber answer each request it received, once). Replies come back on the
requester's inbox, ``_INBOX.<user>.>`` (:func:`inbox_prefix`), which only that user may
subscribe to: one kind cannot read another's replies, nor answer for a kind it is not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from danube.bus.subjects import Kind, Subjects

__all__ = [
    "INBOX_ROOT",
    "KIND_PERMISSIONS",
    "BusPermissions",
    "KindPermissions",
    "bus_permissions",
    "inbox_prefix",
    "nats_authorization",
]

INBOX_ROOT = "_INBOX"
"""nats-py's default inbox prefix; a user's own is one token below it."""


@dataclass(frozen=True)
class KindPermissions:
    """The subject kinds one service kind publishes (and requests) and subscribes (and serves)."""

    publish: frozenset[Kind]
    subscribe: frozenset[Kind]


def _kinds(*kinds: Kind) -> frozenset[Kind]:
    return frozenset(kinds)


# Read from the code of each service: its Bus.publish/request calls (directly or through the
# IngestClient, CloudClient and DispatcherClient it uses) and its Bus.subscribe/serve calls.
# docs/bus.md's table says who serves and who calls each subject.
KIND_PERMISSIONS: dict[str, KindPermissions] = {
    "discovery": KindPermissions(
        # produce (and the ownership probe/claim of IngestClient.produce), topic describe
        # and delete, every consumer operation through DispatcherClient.
        publish=_kinds(
            Kind.PRODUCE,
            Kind.OWNERSHIP,
            Kind.LEADER_PROBE,
            Kind.WAL_STATS,
            Kind.WAL_DELETE,
            Kind.DISPATCH,
            Kind.SUBSCRIPTION_OWNERSHIP,
        ),
        subscribe=_kinds(),
    ),
    "ingest": KindPermissions(
        # live messages once durable; followers fetch from their leader; a replica reads
        # a range of another's copy (around damage, to repair its own); its gRPC door's
        # consumers through DispatcherClient (danube.grpc_door.consumers).
        publish=_kinds(
            Kind.LIVE,
            Kind.REPL_FETCH,
            Kind.REPL_EPOCHS,
            Kind.REPL_LEAVE,
            Kind.REPL_READ,
            Kind.DISPATCH,
            Kind.SUBSCRIPTION_OWNERSHIP,
        ),
        subscribe=_kinds(
            Kind.PRODUCE,
            Kind.WAL_FETCH,
            Kind.WAL_DROP_BELOW,
            Kind.WAL_STATS,
            Kind.WAL_TIME,
            Kind.WAL_DELETE,
            Kind.REPL_FETCH,
            Kind.REPL_EPOCHS,
            Kind.REPL_LEAVE,
            Kind.REPL_READ,
            Kind.OWNERSHIP,
            Kind.LEADER_PROBE,
        ),
    ),
    "uploader": KindPermissions(
        publish=_kinds(Kind.WAL_FETCH, Kind.WAL_STATS),
        subscribe=_kinds(Kind.LIVE),
    ),
    "retention": KindPermissions(
        publish=_kinds(Kind.WAL_STATS, Kind.WAL_DROP_BELOW),
        subscribe=_kinds(),
    ),
    "cloud_reader": KindPermissions(
        publish=_kinds(),
        subscribe=_kinds(Kind.CLOUD_FETCH, Kind.CLOUD_TIME),
    ),
    "dispatcher": KindPermissions(
        # catch-up reads from ingest and the cloud, time seeks, backlog stats, and the
        # dead-letter topic's produce (with IngestClient's ownership probe/claim).
        publish=_kinds(
            Kind.WAL_FETCH,
            Kind.WAL_STATS,
            Kind.WAL_TIME,
            Kind.CLOUD_FETCH,
            Kind.CLOUD_TIME,
            Kind.PRODUCE,
            Kind.OWNERSHIP,
            Kind.LEADER_PROBE,
            Kind.SUBSCRIPTION_CLAIMED,  # its claims, for leaseless dispatchers to hear
        ),
        subscribe=_kinds(
            Kind.LIVE, Kind.DISPATCH, Kind.SUBSCRIPTION_OWNERSHIP, Kind.SUBSCRIPTION_CLAIMED
        ),
    ),
}


@dataclass(frozen=True)
class BusPermissions:
    """One user's NATS subject patterns, ready for nats-server's ``permissions`` block."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]

    def to_nats(self) -> dict[str, Any]:
        """nats-server's ``permissions``: allow lists (all else denied), answering allowed."""
        return {
            "publish": {"allow": list(self.publish)} if self.publish else {"deny": [">"]},
            "subscribe": {"allow": list(self.subscribe)},
            "allow_responses": True,
        }


def inbox_prefix(user: str) -> str:
    """The reply inbox prefix of ``user``'s requests (nats-py's ``inbox_prefix``)."""
    return f"{INBOX_ROOT}.{user}"


def bus_permissions(kind: str, *, user: str, subject_prefix: str) -> BusPermissions:
    """The subject patterns service ``kind`` (logged in as ``user``) may use."""
    table = KIND_PERMISSIONS[kind]
    subjects = Subjects(subject_prefix)
    publish = sorted(subjects.all_of_kind(k) for k in table.publish)
    subscribe = sorted(subjects.all_of_kind(k) for k in table.subscribe)
    subscribe.append(f"{inbox_prefix(user)}.>")
    return BusPermissions(publish=tuple(publish), subscribe=tuple(subscribe))


def nats_authorization(passwords: dict[str, str], *, subject_prefix: str) -> dict[str, Any]:
    """nats-server's ``authorization`` block: one user per service kind in ``passwords``
    (kind -> password), named after its kind, with that kind's permissions."""
    users = []
    for kind in sorted(passwords):
        permissions = bus_permissions(kind, user=kind, subject_prefix=subject_prefix)
        users.append(
            {"user": kind, "password": passwords[kind], "permissions": permissions.to_nats()}
        )
    return {"users": users}
