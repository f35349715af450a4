"""A secured nats-server (danube.up.secure's config): users per service kind, subject
permissions from danube.bus.permissions, private reply inboxes, no anonymous clients."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.aio.msg import Msg

from danube.bus import Bus, BusTimeoutError, NotConnectedError, Request
from danube.config import BusConfig
from danube.up import ServerProcess, free_port, nats_spec
from danube.up.secure import MeshCredentials, ensure_credentials, write_nats_config

pytestmark = pytest.mark.integration

TOPIC = "/default/orders"


@pytest.fixture
def credentials(tmp_path: Path) -> MeshCredentials:
    return ensure_credentials(tmp_path / "data")


@pytest.fixture
def secure_nats(tmp_path: Path, credentials: MeshCredentials) -> Iterator[str]:
    config = write_nats_config(credentials, subject_prefix="danube")
    spec = nats_spec(port=free_port(), monitor_port=free_port(), config_file=config)
    server = ServerProcess(spec, tmp_path / "nats.log")
    server.start()
    try:
        yield f"nats://127.0.0.1:{spec.port}"
    finally:
        server.stop()


def kind_config(url: str, credentials: MeshCredentials, kind: str) -> BusConfig:
    return BusConfig(
        servers=[url],
        user=kind,
        password_file=credentials.nats_password_file(kind),
        connect_timeout_s=2.0,
        max_reconnect_attempts=0,
    )


def test_credentials_are_private_files(credentials: MeshCredentials) -> None:
    assert credentials.dir.stat().st_mode & 0o777 == 0o700
    secrets = [path.read_text().strip() for path in credentials.all_files()]
    assert len(set(secrets)) == len(secrets)  # one password per user
    assert all(len(secret) >= 40 for secret in secrets)
    for path in [*credentials.all_files(), write_nats_config(credentials, subject_prefix="d")]:
        assert path.stat().st_mode & 0o777 == 0o600, path
    # A second run keeps what etcd and the services already know.
    again = ensure_credentials(credentials.dir.parent)
    assert [path.read_text().strip() for path in again.all_files()] == secrets


async def test_anonymous_client_is_refused(secure_nats: str) -> None:
    with pytest.raises((nats.errors.Error, OSError)) as raised:
        await nats.connect(secure_nats, allow_reconnect=False, connect_timeout=2)
    assert "authorization" in str(raised.value).lower()
    with pytest.raises(NotConnectedError):
        await Bus.connect(
            BusConfig(servers=[secure_nats], max_reconnect_attempts=0), name="anon", timeout_s=2
        )


async def test_wrong_password_is_refused_and_not_echoed(
    secure_nats: str, credentials: MeshCredentials
) -> None:
    guess = "not-the-password-0123456789"
    config = BusConfig(
        servers=[secure_nats], user="ingest", password=guess, max_reconnect_attempts=0
    )
    with pytest.raises(NotConnectedError) as raised:
        await Bus.connect(config, name="ingest-0", timeout_s=2)
    assert guess not in str(raised.value)
    assert guess not in repr(config)
    real = credentials.nats_password_file("ingest").read_text().strip()
    assert real not in repr(kind_config(secure_nats, credentials, "ingest"))


async def test_request_reply_between_kinds_on_private_inboxes(
    secure_nats: str, credentials: MeshCredentials
) -> None:
    ingest = await Bus.connect(kind_config(secure_nats, credentials, "ingest"), name="ingest-0")
    discovery = await Bus.connect(
        kind_config(secure_nats, credentials, "discovery"), name="discovery-0"
    )
    try:

        async def produce(request: Request) -> bytes:
            return b"offset:" + request.body

        await ingest.serve(ingest.subjects.produce(TOPIC), produce)
        reply = await discovery.request(discovery.subjects.produce(TOPIC), b"7", timeout_s=3)
        assert reply.body == b"offset:7"
    finally:
        await discovery.close()
        await ingest.close()


async def test_a_kind_cannot_read_another_kinds_subjects_or_replies(
    secure_nats: str, credentials: MeshCredentials
) -> None:
    """ingest's credentials subscribing to the dispatcher's subjects and to discovery's
    reply inbox: the server refuses both (a permissions violation), nothing arrives."""
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    ingest_password = credentials.nats_password_file("ingest").read_text().strip()
    spy = await nats.connect(
        secure_nats, user="ingest", password=ingest_password, error_cb=on_error, connect_timeout=2
    )
    dispatcher = await Bus.connect(
        kind_config(secure_nats, credentials, "dispatcher"), name="dispatcher-0"
    )
    discovery = await Bus.connect(
        kind_config(secure_nats, credentials, "discovery"), name="discovery-0"
    )
    try:
        seen: list[str] = []

        async def spy_cb(msg: Msg) -> None:
            seen.append(msg.subject)

        await spy.subscribe("danube.disp.>", cb=spy_cb)
        await spy.subscribe("_INBOX.discovery.>", cb=spy_cb)
        await spy.flush(timeout=2)

        async def attach(request: Request) -> bytes:
            return b"attached"

        subject = dispatcher.subjects.dispatch(TOPIC, "sub", "attach")
        await dispatcher.serve(dispatcher.subjects.dispatch_all_ops(TOPIC, "sub"), attach)
        reply = await discovery.request(subject, b"", timeout_s=3)
        assert reply.body == b"attached"  # the permitted path works...
        await asyncio.sleep(0.2)
        assert seen == []  # ...and the spy saw neither the request nor the reply
        # (nats-py lowercases the server's message)
        violations = [str(e).lower() for e in errors if "permissions violation" in str(e).lower()]
        assert any("danube.disp.>" in v for v in violations), errors
        assert any("_inbox.discovery.>" in v for v in violations), errors
    finally:
        await discovery.close()
        await dispatcher.close()
        await spy.close()


async def test_a_kind_cannot_publish_outside_its_table(
    secure_nats: str, credentials: MeshCredentials
) -> None:
    """retention may only ask ingest for stats and drops: a forged live message from it
    never reaches the uploader, which may subscribe to live."""
    retention = await Bus.connect(
        kind_config(secure_nats, credentials, "retention"), name="retention-0"
    )
    uploader = await Bus.connect(kind_config(secure_nats, credentials, "uploader"), name="up-0")
    ingest = await Bus.connect(kind_config(secure_nats, credentials, "ingest"), name="ingest-0")
    try:
        live = await uploader.subscribe(uploader.subjects.live(TOPIC))
        await retention.publish(retention.subjects.live(TOPIC), b"forged")
        await retention.flush()
        await ingest.publish(ingest.subjects.live(TOPIC), b"durable")
        assert (await live.next(timeout_s=3)).body == b"durable"  # ingest's arrives...
        with pytest.raises(BusTimeoutError):  # ...retention's never did
            await live.next(timeout_s=0.5)
    finally:
        await ingest.close()
        await uploader.close()
        await retention.close()
