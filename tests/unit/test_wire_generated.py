"""The committed wire modules are what the .proto files give, and the contract keeps the
method paths Danube's clients call."""

from __future__ import annotations

import pytest

from danube.wire import DanubeApi_pb2, SchemaRegistry_pb2
from danube.wire.generate import stale

pytestmark = pytest.mark.unit


def test_generated_modules_match_the_proto_files() -> None:
    assert stale() == []


def _paths(module: object) -> set[str]:
    file = module.DESCRIPTOR  # type: ignore[attr-defined]
    return {
        f"/{file.package}.{service.name}/{method.name}"
        for service in file.services_by_name.values()
        for method in service.methods
    }


def test_method_paths_are_danubes() -> None:
    assert _paths(DanubeApi_pb2) == {
        "/danube.Discovery/TopicLookup",
        "/danube.Discovery/TopicPartitions",
        "/danube.ProducerService/CreateProducer",
        "/danube.ProducerService/SendMessage",
        "/danube.ConsumerService/Subscribe",
        "/danube.ConsumerService/ReceiveMessages",
        "/danube.ConsumerService/Ack",
        "/danube.ConsumerService/Nack",
        "/danube.HealthCheck/HealthCheck",
    }
    assert "/danube_schema.SchemaRegistry/RegisterSchema" in _paths(SchemaRegistry_pb2)


def test_field_numbers_of_the_message_id() -> None:
    fields = {f.name: f.number for f in DanubeApi_pb2.MsgID.DESCRIPTOR.fields}
    assert fields == {"producer_id": 1, "topic_name": 2, "broker_addr": 3, "topic_offset": 5}
