"""Producer session routes: ``/v1/topics/{ns}/{topic}/producers[/{id}[/keepalive]]``
(docs/producers.md; the logic is :class:`~danube.admission.sessions.ProducerSessions`), and
an idempotent producer's epoch: ``POST …/producers/{name}/epoch``
(:mod:`danube.discovery.produce.epochs`)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from danube.admission.sessions import ProducerSessions
from danube.discovery.doors.http.params import (
    Namespace,
    ProducerIdParam,
    ProducerNameParam,
    ProduceTopic,
    Topic,
)
from danube.discovery.doors.http.state import ServicesDep
from danube.discovery.errors import BadRequestError, NotFoundError
from danube.discovery.produce.epochs import next_epoch
from danube.frame import MAX_PRODUCER_NAME_BYTES
from danube.meta import TopicName
from danube.names import produce_topic, user_topic, validate_segment
from danube.wire.api.producers import ProducerEpochOut, ProducerList, ProducerOpened, ProducerOut
from danube.wire.opens import ProducerOpen

router = APIRouter(prefix="/v1")


@router.post("/topics/{ns}/{topic}/producers", status_code=201, response_model=ProducerOpened)
async def open_producer(
    ns: Namespace, topic: Topic, body: ProducerOpen, services: ServicesDep
) -> ProducerOpened:
    """Open a producer session (creating the topic when auto-creation is on); 409
    ``exclusive_producer`` while an exclusive producer holds the topic, 409
    ``producer_exists`` for an exclusive one while any producer is connected."""
    session = await services.producers.open(
        user_topic(ns, topic), body.name, access_mode=body.access_mode
    )
    return ProducerOpened(
        producer_id=session.producer_id,
        access_mode=session.access_mode,
        session_ttl_ms=int(session.ttl_s * 1000),
    )


@router.post("/topics/{ns}/{topic}/producers/{producer_id}/keepalive", status_code=204)
async def keepalive_producer(
    ns: Namespace, topic: Topic, producer_id: ProducerIdParam, services: ServicesDep
) -> Response:
    """Keep the session alive for another TTL; 404 ``producer_not_found`` once it is gone
    (expired, closed, or removed with its topic): open a new one."""
    name = user_topic(ns, topic)
    if not await services.producers.keepalive(name, validate_segment("producer id", producer_id)):
        raise NotFoundError(
            f"producer {producer_id} has no session on {name}", code="producer_not_found"
        )
    return Response(status_code=204)


@router.delete("/topics/{ns}/{topic}/producers/{producer_id}", status_code=204)
async def close_producer(
    ns: Namespace, topic: Topic, producer_id: ProducerIdParam, services: ServicesDep
) -> Response:
    """Close the session at once (idempotent: a session already gone is not an error)."""
    name = user_topic(ns, topic)
    await services.producers.close(name, validate_segment("producer id", producer_id))
    return Response(status_code=204)


@router.post("/topics/{ns}/{topic}/producers/{name}/epoch", response_model=ProducerEpochOut)
async def producer_epoch(
    ns: Namespace, topic: ProduceTopic, name: ProducerNameParam, services: ServicesDep
) -> ProducerEpochOut:
    """A new epoch of the idempotent producer ``name`` on the topic (its partitions share
    it): the previous + 1, 1 the first time. A producer takes one when it starts, so the
    instance it replaces is fenced (409 ``producer_fenced`` at the partitions' leaders).
    The namespace must exist; the topic need not yet."""
    target = produce_topic(ns, topic)
    if len(name.encode("utf-8")) > MAX_PRODUCER_NAME_BYTES:
        raise BadRequestError(
            f"name: over {MAX_PRODUCER_NAME_BYTES} UTF-8 bytes", code="invalid_request"
        )
    await services.catalog.get_namespace(ns)  # 404 namespace_not_found
    epoch = await next_epoch(services.store, target, name)
    return ProducerEpochOut(producer=name, epoch=epoch)


@router.get("/topics/{ns}/{topic}/producers", response_model=ProducerList)
async def list_producers(ns: Namespace, topic: Topic, services: ServicesDep) -> ProducerList:
    """The open producer sessions of the topic and of its partitions."""
    return ProducerList(producers=await producers_of(services.producers, user_topic(ns, topic)))


async def producers_of(sessions: ProducerSessions, topic: TopicName) -> list[ProducerOut]:
    """The open sessions of ``topic`` and its partitions as the API shows them (also in
    topic describe)."""
    return [
        ProducerOut(
            producer_id=producer_id,
            topic=str(scoped),
            name=record.name,
            access_mode=record.access_mode,
            created_ms=record.created_ms,
        )
        for scoped, producer_id, record in await sessions.list_sessions(topic)
    ]
