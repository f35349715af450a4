"""Statuses are the doors': every error of a bus contract (the dispatcher's refusals, the one
``bad_request``) has a kind, and the HTTP and gRPC doors answer the kind, the same whether
the error is raised in the process or arrives over the bus (its kind travels with its
code)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import grpc
import pytest

from danube.bus import RemoteError
from danube.bus.protocol import error_headers, remote_error
from danube.client.errors import NotFoundError, api_error
from danube.discovery.errors import error_body, http_status, ws_close_code
from danube.dispatcher.store import NotOwnerError
from danube.errors import DanubeError, ErrorKind
from danube.grpc_door.status import grpc_status
from danube.wire.dispatcher import errors as dispatcher_errors
from danube.wire.dispatcher import protocol as dispatcher_protocol
from danube.wire.errors import BadRequestError
from danube.wire.ingest import protocol as ingest_protocol

pytestmark = pytest.mark.unit

# The statuses the dispatcher's errors are answered with.
STATUS_BY_CODE = {
    "dispatcher_error": 500,
    "subscription_taken": 409,
    "consumer_exists": 409,
    "policy_conflict": 409,
    "consumer_not_found": 404,
    "consumer_detached": 410,  # detached for never acking: not a cue to attach again
    "subscription_not_found": 404,
    "unknown_partition": 500,
    "offset_out_of_range": 400,
    "position_unavailable": 503,
    "ack_not_durable": 503,
    "claim_refused": 503,  # balancing: another member of the queue group may take it
    "data_damaged": 500,
    "not_owner": 503,  # danube.dispatcher.store
    "bad_request": 400,
    "too_many_subscriptions": 409,
    "too_many_consumers": 409,
}


def _dispatcher_error_classes() -> list[type[DanubeError]]:
    classes: list[type[DanubeError]] = [dispatcher_errors.DispatcherError, NotOwnerError]
    pending = dispatcher_errors.DispatcherError.__subclasses__()
    while pending:  # subclasses of subclasses too (consumer_detached is a not-found)
        cls = pending.pop()
        classes.append(cls)
        pending += cls.__subclasses__()
    return sorted(set(classes) - {dispatcher_errors.PolicyLimitError}, key=lambda c: c.__name__)


def _over_the_bus(error: DanubeError) -> RemoteError:
    """``error`` as the caller of a bus request gets it: an error reply's headers, read."""
    remote = remote_error(error_headers(error), subject="s")
    assert remote is not None
    return remote


@pytest.mark.parametrize("cls", _dispatcher_error_classes(), ids=lambda c: c.__name__)
def test_each_dispatcher_code_has_its_status_by_its_kind(cls: type[DanubeError]) -> None:
    status = STATUS_BY_CODE[cls.code]
    error = DanubeError("m", code=cls.code, retriable=cls.retriable, kind=cls.kind)
    remote = _over_the_bus(error)
    assert (remote.code, remote.kind, remote.retriable) == (cls.code, cls.kind, cls.retriable)
    assert http_status(remote) == status
    assert error_body(remote) == {"error": {"code": cls.code, "message": "m"}}
    assert not hasattr(cls, "status")  # no second place for it


def test_a_reply_without_a_kind_is_internal_or_unavailable_when_retriable() -> None:
    # A peer of an older version sends no kind: a retriable failure is still a 503.
    assert http_status(RemoteError(code="x", message="m", retriable=True)) == 503
    assert http_status(RemoteError(code="x", message="m", retriable=False)) == 500
    headers = error_headers(DanubeError("m", kind=ErrorKind.NOT_FOUND))
    headers["Danube-Error-Kind"] = "no_such_kind"  # an unknown kind is no kind
    unknown = remote_error(headers)
    assert unknown is not None
    assert unknown.kind is ErrorKind.INTERNAL


@pytest.mark.parametrize("code", ["too_many_subscriptions", "too_many_consumers"])
def test_policy_limits_answer_409(code: str) -> None:
    error = dispatcher_errors.PolicyLimitError("over", code=code)
    assert http_status(error) == 409
    assert http_status(_over_the_bus(error)) == 409


@pytest.mark.parametrize("code", ["nothing_to_skip", "skip_backwards"])
def test_a_refused_subscription_skip_is_400_not_500(code: str) -> None:
    # The dispatcher refuses with the contracts' BadRequestError and a narrower code.
    assert http_status(BadRequestError("no", code=code)) == 400
    assert http_status(_over_the_bus(BadRequestError("no", code=code))) == 400


def test_one_bad_request_error_for_every_contract() -> None:
    assert ingest_protocol.BadRequestError is BadRequestError
    assert dispatcher_protocol.BadRequestError is BadRequestError
    error = BadRequestError("no such layout")
    assert (error.code, error.retriable) == ("bad_request", False)
    assert http_status(error) == 400


def test_consumer_detached_is_410_a_ws_close_4410_failed_precondition_and_not_reattached() -> None:
    detached = dispatcher_errors.ConsumerDetachedError(
        "detached: ...", consumer_id="c", reason="never acked"
    )
    remote = _over_the_bus(detached)
    assert http_status(remote) == 410
    assert ws_close_code(remote) == 4410
    assert grpc_status(remote) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "consumer_detached",
        "consumer_detached: detached: ...",
    )
    # The SDK: a not-found, not retriable, and not the code it attaches again on.
    error = api_error(410, "consumer_detached", "detached: ...")
    assert isinstance(error, NotFoundError)
    assert not error.retriable
    assert error.code != "consumer_not_found"


def _documented_statuses() -> dict[str, set[int]]:
    """Each code of docs/http-api.md's error table, and the statuses its rows give it."""
    text = (Path(__file__).resolve().parents[2] / "docs/http-api.md").read_text()
    section = text.split("\n## Errors\n", 1)[1].split("\n## ", 1)[0]
    statuses: dict[str, set[int]] = {}
    for line in section.splitlines():
        cells = line.split("|")
        if line.startswith("| ") and len(cells) >= 4 and cells[1].strip().isdigit():
            for code in re.findall(r"`([a-z_]+)`", cells[2]):
                statuses.setdefault(code, set()).add(int(cells[1]))
    return statuses


def _error_classes() -> list[type[DanubeError]]:
    """Every error class of the services and libraries a request passes through."""
    for module in (
        "danube.discovery.app",
        "danube.dispatcher.app",
        "danube.ingest.app",
        "danube.security",
        "danube.schemas",
        "danube.storage",
    ):
        importlib.import_module(module)
    found: set[type[DanubeError]] = set()
    pending = list(DanubeError.__subclasses__())
    while pending:
        cls = pending.pop()
        if cls not in found:
            found.add(cls)
            pending += cls.__subclasses__()
    # Not the classes other tests define for themselves.
    ours = {cls for cls in found if cls.__module__.startswith("danube.")}
    return sorted(ours, key=lambda c: (c.__module__, c.__name__))


def test_each_error_class_is_answered_with_the_status_the_docs_give_its_code() -> None:
    # The kind a class states is the status the error table promises for its code.
    documented = _documented_statuses()
    checked = 0
    for cls in _error_classes():
        if cls.code not in documented or cls.code == "timeout":  # several classes, one row
            continue
        status = http_status(
            DanubeError("m", code=cls.code, retriable=cls.retriable, kind=cls.kind)
        )
        assert status in documented[cls.code], f"{cls.__module__}.{cls.__name__} {cls.code}"
        checked += 1
    assert checked > 40  # the walk found the mesh's classes
