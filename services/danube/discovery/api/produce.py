"""The produce route: ``POST /v1/topics/{ns}/{topic}/messages``."""

from __future__ import annotations

from fastapi import APIRouter

from danube.discovery.api.params import Namespace, Topic
from danube.discovery.api.state import ServicesDep
from danube.discovery.catalog import user_topic
from danube.discovery.models import ProduceRequest, ProduceResponse

router = APIRouter(prefix="/v1")


@router.post("/topics/{ns}/{topic}/messages", response_model=ProduceResponse)
async def produce(
    ns: Namespace, topic: Topic, body: ProduceRequest, services: ServicesDep
) -> ProduceResponse:
    """Store a batch of messages; one ``{partition, offset}`` per message, in order. 409
    ``producer_fenced`` while an exclusive producer other than ``producer_id`` holds the
    topic."""
    name = user_topic(ns, topic)
    await services.producers.check(name, body.producer_id)
    return ProduceResponse(results=await services.producer.produce(name, body))
