"""Statuses are the front door's: every error of a bus contract (the dispatcher's refusals,
the one ``bad_request``) gets its HTTP status from discovery's one table, the same status
whether it is raised in the process or arrives over the bus as a code."""

from __future__ import annotations

import grpc
import pytest

from danube.bus import RemoteError
from danube.client.errors import NotFoundError, api_error
from danube.discovery.errors import error_body, http_status, ws_close_code
from danube.discovery.grpc_api.status import grpc_status
from danube.dispatcher.store import NotOwnerError
from danube.errors import DanubeError
from danube.wire.dispatcher import errors as dispatcher_errors
from danube.wire.dispatcher import protocol as dispatcher_protocol
from danube.wire.errors import BadRequestError
from danube.wire.ingest import protocol as ingest_protocol

pytestmark = pytest.mark.unit

# The statuses the dispatcher's errors carried themselves before the table held them all.
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


@pytest.mark.parametrize("cls", _dispatcher_error_classes(), ids=lambda c: c.__name__)
def test_each_dispatcher_code_has_its_status_in_the_one_table(cls: type[DanubeError]) -> None:
    status = STATUS_BY_CODE[cls.code]
    remote = RemoteError(code=cls.code, message="m", retriable=cls.retriable)
    assert http_status(remote) == status
    assert error_body(remote) == {"error": {"code": cls.code, "message": "m"}}
    assert not hasattr(cls, "status")  # no second place for it


@pytest.mark.parametrize("code", ["too_many_subscriptions", "too_many_consumers"])
def test_policy_limits_answer_409(code: str) -> None:
    error = dispatcher_errors.PolicyLimitError("over", code=code)
    assert http_status(error) == 409
    assert http_status(RemoteError(code=code, message="over", retriable=False)) == 409


@pytest.mark.parametrize("code", ["nothing_to_skip", "skip_backwards"])
def test_a_refused_subscription_skip_is_400_not_500(code: str) -> None:
    # The dispatcher refuses with the contracts' BadRequestError and a narrower code.
    assert http_status(BadRequestError("no", code=code)) == 400
    assert http_status(RemoteError(code=code, message="no", retriable=False)) == 400


def test_one_bad_request_error_for_every_contract() -> None:
    assert ingest_protocol.BadRequestError is BadRequestError
    assert dispatcher_protocol.BadRequestError is BadRequestError
    error = BadRequestError("no such layout")
    assert (error.code, error.retriable) == ("bad_request", False)
    assert http_status(error) == 400


def test_consumer_detached_is_410_a_ws_close_4410_failed_precondition_and_not_reattached() -> None:
    remote = RemoteError(code="consumer_detached", message="detached: ...", retriable=False)
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
