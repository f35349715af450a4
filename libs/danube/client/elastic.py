"""The elasticity routes of the admin API (docs/http-api.md, "Reassignments and drains"):
reassign a partition's replicas while it serves, cancel, list reassignments with their
progress, drain and undrain ingest nodes. :class:`ElasticAdmin` is part of
:class:`danube.client.AsyncAdmin` (``client.admin.reassign_partition(...)``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from danube.client._answers import parse_answer as _parse
from danube.client._http import HttpCore
from danube.client.errors import InvalidArgumentError
from danube.client.messages import topic_name, topic_path
from danube.names import InvalidNameError, TopicName, validate_segment


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class ReplicaAssignment(_Model):
    """A partition's replica set; while ``adding`` or ``removing`` is not empty, a
    reassignment from ``original`` to ``target`` is under way. ``changed`` is False when
    the request asked for what was already so."""

    partition: str
    replicas: list[str]
    target: list[str]
    original: list[str]
    adding: list[str] = []
    removing: list[str] = []
    catchup_bytes_s: int | None = None
    assigned_ms: int
    changed: bool = True


class ReplicaProgress(_Model):
    """A replica being added: in the ISR yet, its end and lag behind the leader (None: the
    leader did not answer)."""

    node_id: str
    in_isr: bool
    end: int | None = None
    lag: int | None = None


class Reassignment(_Model):
    """A reassignment under way, with the partition's leader, ISR and per-replica progress."""

    partition: str
    replicas: list[str]
    target: list[str]
    original: list[str]
    adding: list[str] = []
    removing: list[str] = []
    leader: str | None = None
    isr: list[str] = []
    catchup_bytes_s: int | None = None
    assigned_ms: int
    progress: list[ReplicaProgress] = []


class Reassignments(_Model):
    reassignments: list[Reassignment]
    truncated: bool = False


class DrainStatus(_Model):
    """A node's drain: asked when (None: not drained), the partitions it still holds a
    replica of, those leaving it now; ``done`` once drained and holding nothing."""

    node_id: str
    drained: bool
    requested_ms: int | None = None
    replicas: list[str] = []
    leaving: list[str] = []
    subscriptions: list[str] = []
    kinds: list[str] = []
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
