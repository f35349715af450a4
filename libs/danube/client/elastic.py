"""The elasticity routes of the admin API (docs/http-api.md, "Reassignments and drains"):
reassign a partition's replicas while it serves, cancel, list reassignments with their
progress, drain and undrain ingest nodes. :class:`ElasticAdmin` is part of
:class:`danube.client.AsyncAdmin` (``client.admin.reassign_partition(...)``)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from danube.client._answers import parse_answer as _parse
from danube.client._http import HttpCore
from danube.client.errors import InvalidArgumentError
from danube.client.messages import topic_name, topic_path
from danube.names import InvalidNameError, TopicName, validate_segment
from danube.wire.api import elastic as api

# The answers are danube.wire.api's, as in danube.client.subscriptions: each model here
# subclasses the one the server answers with and states only what a client tolerates beyond
# it (a field an older server may leave out, the SDK's own models where answers nest).


class ReplicaAssignment(api.AssignmentOut):
    """A partition's replica set; while ``adding`` or ``removing`` is not empty, a
    reassignment from ``original`` to ``target`` is under way. ``changed`` is False when
    the request asked for what was already so."""

    adding: list[str] = Field(default_factory=list)
    removing: list[str] = Field(default_factory=list)
    catchup_bytes_s: int | None = None


class ReplicaProgress(api.ReplicaProgress):
    """A replica being added: in the ISR yet, its end and lag behind the leader (None: the
    leader did not answer)."""

    end: int | None = None
    lag: int | None = None


class Reassignment(api.ReassignmentOut):
    """A reassignment under way, with the partition's leader, ISR and per-replica progress."""

    adding: list[str] = Field(default_factory=list)
    removing: list[str] = Field(default_factory=list)
    leader: str | None = None
    isr: list[str] = Field(default_factory=list)
    catchup_bytes_s: int | None = None
    progress: list[ReplicaProgress] = Field(default_factory=list)


class Reassignments(api.ReassignmentList):
    reassignments: list[Reassignment]
    truncated: bool = False


class DrainStatus(api.DrainOut):
    """A node's drain: asked when (None: not drained), the partitions it still holds a
    replica of, those leaving it now; ``done`` once drained and holding nothing."""

    requested_ms: int | None = None
    replicas: list[str] = Field(default_factory=list)
    leaving: list[str] = Field(default_factory=list)
    subscriptions: list[str] = Field(default_factory=list)
    kinds: list[str] = Field(default_factory=list)
    done: bool = False


def _node(node_id: str) -> str:
    try:
        return validate_segment("node", node_id)
    except InvalidNameError as exc:
        raise InvalidArgumentError(exc.message, code=exc.code) from exc


def _reassign_path(partition: str | TopicName) -> str:
    return f"/v1/partitions/{topic_path(topic_name(partition))}/reassign"


class ElasticAdmin:
    """Reassignments and drains (mixed into :class:`danube.client.AsyncAdmin`)."""

    _http: HttpCore

    async def reassign_partition(
        self,
        partition: str | TopicName,
        replicas: list[str],
        *,
        catchup_bytes_s: int | None = None,
    ) -> ReplicaAssignment:
        """Start (or change) a reassignment of ``partition`` (``/ns/t`` or
        ``/ns/t-part-N``) to ``replicas``, preferred leader first, as many as it has; its
        leader carries it out while serving. Asking twice for the same changes nothing."""
        body: dict[str, Any] = {"replicas": [_node(n) for n in replicas]}
        if catchup_bytes_s is not None:
            body["catchup_bytes_s"] = catchup_bytes_s
        answer = await self._http.request("POST", _reassign_path(partition), body=body)
        return _parse(ReplicaAssignment, answer.body, "reassign partition")

    async def cancel_reassignment(self, partition: str | TopicName) -> ReplicaAssignment:
        """Cancel the reassignment under way: back to the original replicas."""
        answer = await self._http.request("DELETE", _reassign_path(partition))
        return _parse(ReplicaAssignment, answer.body, "cancel reassignment")

    async def reassignments(self) -> Reassignments:
        """Every reassignment under way, with its progress."""
        answer = await self._http.request_retrying(
            "GET", "/v1/reassignments", timeout_s=self._http.timeout_s
        )
        return _parse(Reassignments, answer.body, "reassignments")

    async def drain_node(self, node_id: str) -> DrainStatus:
        """Drain an ingest node (idempotent): its replicas move off, nothing new comes."""
        answer = await self._http.request_retrying(
            "POST", f"/v1/nodes/{_node(node_id)}/drain", timeout_s=self._http.timeout_s
        )
        return _parse(DrainStatus, answer.body, "drain node")

    async def undrain_node(self, node_id: str) -> None:
        """Lift a node's drain (``not_drained`` when there is none)."""
        await self._http.request("DELETE", f"/v1/nodes/{_node(node_id)}/drain")

    async def drain_status(self, node_id: str) -> DrainStatus:
        """Where a node's drain stands."""
        answer = await self._http.request_retrying(
            "GET", f"/v1/nodes/{_node(node_id)}/drain", timeout_s=self._http.timeout_s
        )
        return _parse(DrainStatus, answer.body, "drain status")
