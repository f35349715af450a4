"""Elasticity routes: an operator's reassignments of a partition's replicas (start, cancel,
list with progress) and drains of ingest nodes (docs/http-api.md, docs/operations.md). The
work itself is :mod:`danube.discovery.controller.reassignments`; these only translate."""

from __future__ import annotations

from fastapi import APIRouter, Response

from danube.discovery.controller import reassignments
from danube.discovery.controller.moves import check_partition
from danube.discovery.doors.bodies.elastic import ReassignRequest
from danube.discovery.doors.http.params import Namespace, NodeIdParam, Partition
from danube.discovery.doors.http.state import ServicesDep
from danube.meta import TopicName
from danube.meta.records import Assignment
from danube.names import validate_segment
from danube.wire.api.elastic import (
    AssignmentOut,
    DrainOut,
    ReassignmentList,
    ReassignmentOut,
    ReplicaProgress,
)

router = APIRouter(prefix="/v1")


def _assignment_out(name: TopicName, record: Assignment, *, changed: bool) -> AssignmentOut:
    return AssignmentOut(
        partition=str(name),
        replicas=list(record.replicas),
        target=list(record.target),
        original=list(record.original),
        adding=list(record.adding),
        removing=list(record.removing),
        catchup_bytes_s=record.catchup_bytes_s,
        assigned_ms=record.assigned_ms,
        changed=changed,
    )


async def _partition(services: ServicesDep, ns: str, partition: str) -> TopicName:
    validate_segment("namespace", ns)
    name = TopicName(ns, partition)
    check_partition(name, await services.catalog.get_topic(name.parent))
    return name


@router.post("/partitions/{ns}/{partition}/reassign", response_model=AssignmentOut)
async def reassign(
    ns: Namespace, partition: Partition, body: ReassignRequest, services: ServicesDep
) -> AssignmentOut:
    """Start (or change) a reassignment of the partition's replicas to ``replicas``,
    preferred leader first; its leader carries it out while serving."""
    name = await _partition(services, ns, partition)
    record, changed = await reassignments.start(
        services.store, name, tuple(body.replicas), catchup_bytes_s=body.catchup_bytes_s
    )
    return _assignment_out(name, record, changed=changed)


@router.delete("/partitions/{ns}/{partition}/reassign", response_model=AssignmentOut)
async def cancel_reassign(
    ns: Namespace, partition: Partition, services: ServicesDep
) -> AssignmentOut:
    """Cancel the reassignment under way: back to the original replicas."""
    name = await _partition(services, ns, partition)
    return _assignment_out(name, await reassignments.stop(services.store, name), changed=True)


@router.get("/reassignments", response_model=ReassignmentList)
async def list_reassignments(services: ServicesDep) -> ReassignmentList:
    """Every partition with a reassignment under way and, per replica being added, its lag
    and whether it is in the ISR yet."""
    found, truncated = await reassignments.under_way(services.bus, services.store)
    return ReassignmentList(
        reassignments=[
            ReassignmentOut(
                partition=str(r.partition),
                replicas=list(r.assignment.replicas),
                target=list(r.assignment.target),
                original=list(r.assignment.original),
                adding=list(r.assignment.adding),
                removing=list(r.assignment.removing),
                leader=r.leader,
                isr=list(r.isr),
                catchup_bytes_s=r.assignment.catchup_bytes_s,
                assigned_ms=r.assignment.assigned_ms,
                progress=[
                    ReplicaProgress(node_id=p.node_id, in_isr=p.in_isr, end=p.end, lag=p.lag)
                    for p in r.progress
                ],
            )
            for r in found
        ],
        truncated=truncated,
    )


def _drain_out(found: reassignments.DrainStatus) -> DrainOut:
    return DrainOut(
        node_id=found.node_id,
        drained=found.requested_ms is not None,
        requested_ms=found.requested_ms,
        replicas=[str(p) for p in found.replicas],
        leaving=[str(p) for p in found.leaving],
        subscriptions=list(found.subscriptions),
        kinds=list(found.kinds),
        done=found.done,
    )


@router.post(
    "/nodes/{node_id}/drain",
    response_model=DrainOut,
    status_code=201,
    responses={200: {"model": DrainOut, "description": "It was drained already"}},
)
async def drain(node_id: NodeIdParam, services: ServicesDep, response: Response) -> DrainOut:
    """Drain a node: an ingest node's replicas move off it (the controller's balancer,
    within its moves limit) and nothing new is placed on it; a dispatcher hands its
    subscriptions over to the others and claims no more."""
    _, created = await reassignments.drain(services.store, node_id)
    response.status_code = 201 if created else 200
    return _drain_out(await reassignments.status(services.store, node_id))


@router.delete("/nodes/{node_id}/drain", status_code=204)
async def undrain(node_id: NodeIdParam, services: ServicesDep) -> Response:
    """Lift a drain: the node takes replicas again (the balancer spreads them back)."""
    await reassignments.undrain(services.store, node_id)
    return Response(status_code=204)


@router.get("/nodes/{node_id}/drain", response_model=DrainOut)
async def drain_status(node_id: NodeIdParam, services: ServicesDep) -> DrainOut:
    """Where a node's drain stands: the replicas it still holds, those leaving it now."""
    return _drain_out(await reassignments.status(services.store, node_id))
