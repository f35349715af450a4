"""TLS and mTLS on real listeners with a CA from danube.security.pki: discovery's HTTP API
(produce, lookup, WebSocket stream) and gRPC API, a service's health port, the transport
principal over HTTP, WebSocket and gRPC, and certificates reloaded from their files."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import sys
from collections.abc import AsyncIterator, Callable, Generator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket
from websockets.asyncio.client import connect

from danube.bench import grpc_compare
from danube.client import AsyncDanubeClient, ClientTls, DanubeClient, TransportError
from danube.config import DanubeSettings, ServiceConfig, TlsConfig
from danube.config.model import ClientAuthMode
from danube.discovery import app as discovery_app
from danube.dispatcher import app as dispatcher_app
from danube.ingest import app as ingest_app
from danube.runtime.healthcheck import check, probe_url, read_health_url, write_health_file
from danube.runtime.http import HealthServer, bound_port, wait_started
from danube.runtime.listener import uvicorn_limits, uvicorn_tls
from danube.runtime.service import run_in_process
from danube.security.pki import CertPaths, LocalPki, create_ca, ensure_local_pki, issue_server_cert
from danube.security.tls import (
    TlsError,
    grpc_server_credentials,
    grpc_tls_principal,
    http_tls_principal,
)
from danube.up import free_port
from danube.wire.client import WireClient, channel_credentials
from tests.readiness import until_ready

pytestmark = pytest.mark.integration

MeshSettings = Callable[..., DanubeSettings]  # the mesh_settings fixture (conftest.py)
HOSTS = ["localhost", "127.0.0.1"]


@pytest.fixture
def pki(tmp_path: Path) -> LocalPki:
    return ensure_local_pki(tmp_path / "pki", HOSTS, clients=["alice"])


def server_tls(
    pki: LocalPki, client_auth: ClientAuthMode = "none", reload_s: float = 5.0
) -> TlsConfig:
    return TlsConfig(
        cert_file=pki.server.cert,
        key_file=pki.server.key,
        client_ca_file=None if client_auth == "none" else pki.ca.cert,
        client_auth=client_auth,
        reload_check_interval_s=reload_s,
    )


def client_context(ca: Path, client: CertPaths | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        context.load_cert_chain(client.cert, client.key)
    return context


# --- a small app on the listener every service uses, that says who the client is ---------


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def whoami_app() -> Starlette:
    async def whoami(request: Request) -> Response:
        return JSONResponse({"principal": http_tls_principal(request)})

    async def whoami_ws(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_json({"principal": http_tls_principal(websocket)})
        await websocket.close()

    return Starlette(routes=[Route("/whoami", whoami), WebSocketRoute("/ws", whoami_ws)])


@contextlib.asynccontextmanager
async def whoami_server(tls: TlsConfig) -> AsyncIterator[int]:
    """``whoami_app`` served as discovery serves its API (limits, TLS, WebSocket protocol);
    yields its port."""
    server = _Server(
        uvicorn.Config(
            whoami_app(),
            host="127.0.0.1",
            port=0,
            log_level="warning",
            lifespan="off",
            **uvicorn_limits(ServiceConfig(), listener="test"),
            **uvicorn_tls(tls),
        )
    )
    serving = asyncio.create_task(server.serve())
    try:
        await wait_started(server, serving, 10.0)
        yield bound_port(server)
    finally:
        server.should_exit = True
        await serving


async def whoami(port: int, context: ssl.SSLContext) -> Any:
    async with httpx.AsyncClient(verify=context, trust_env=False) as http:
        response = await http.get(f"https://127.0.0.1:{port}/whoami")
        assert response.status_code == 200
        return response.json()["principal"]


async def whoami_ws(port: int, context: ssl.SSLContext) -> Any:
    async with connect(f"wss://127.0.0.1:{port}/ws", ssl=context, proxy=None) as ws:
        return json.loads(await ws.recv())["principal"]


async def peer_certificate(port: int, context: ssl.SSLContext) -> bytes:
    """The DER certificate a new connection to ``port`` is shown."""
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        assert der is not None
        return bytes(der)
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()


# --- discovery: HTTPS, WSS and gRPC over TLS ---------------------------------------------


@contextlib.asynccontextmanager
async def tls_mesh(
    mesh_settings: MeshSettings, discovery_tls: TlsConfig, ingest_tls: TlsConfig | None = None
) -> AsyncIterator[DanubeSettings]:
    """Ingest, a dispatcher and discovery in this process, discovery (and ingest's health
    port, when given) serving TLS; yields the settings once discovery is ready."""
    settings = mesh_settings()
    discovery = settings.discovery.model_copy(
        update={"grpc_port": free_port(), "tls": discovery_tls}
    )
    ingest = settings.ingest.model_copy(update={"tls": ingest_tls or TlsConfig()})
    settings = settings.model_copy(update={"discovery": discovery, "ingest": ingest})
    # The readiness probe: trusts the CA beside the server's files; shows alice's
    # certificate (ensure_local_pki's layout) when discovery requires one.
    pki_dir = Path(str(discovery_tls.cert_file)).parent
    alice = CertPaths(pki_dir / "clients/alice.pem", pki_dir / "clients/alice-key.pem")
    required = discovery_tls.client_auth == "required"
    context = client_context(pki_dir / "ca.pem", alice if required else None)
    async with (
        run_in_process(ingest_app.serve, settings, "ingest-1", must_stop_cleanly=True),
        run_in_process(dispatcher_app.serve, settings, "disp-1", must_stop_cleanly=True),
        run_in_process(discovery_app.serve, settings, "disc-1", must_stop_cleanly=True) as task,
        httpx.AsyncClient(
            base_url=f"https://127.0.0.1:{discovery.port}", verify=context, trust_env=False
        ) as probe,
    ):
        await until_ready(probe, task)
        yield settings


async def test_https_produce_lookup_stream_and_grpc_with_the_ca(
    mesh_settings: MeshSettings, pki: LocalPki
) -> None:
    async with tls_mesh(mesh_settings, server_tls(pki), ingest_tls=server_tls(pki)) as settings:
        port, grpc_port = settings.discovery.port, settings.discovery.grpc_port
        url = f"https://127.0.0.1:{port}"
        async with AsyncDanubeClient(url, tls=ClientTls(ca_file=pki.ca.cert)) as client:
            await client.admin.create_topic("/default/secure", partitions=0)
            lookup = await client.admin.lookup("/default/secure")
            assert lookup.name == "/default/secure"
            assert len(lookup.partitions) == 1
            async with client.producer("/default/secure") as producer:
                stored = [await producer.send_and_wait(f"m{i}".encode()) for i in range(3)]
            assert [s.offset for s in stored] == [0, 1, 2]
            # The consumer stream is a WebSocket: wss:// on the same listener.
            consumer = client.consumer("/default/secure", "sub", start="earliest", mode="stream")
            async with consumer, asyncio.timeout(20):
                got = [await consumer.receive() for _ in range(3)]
            assert [m.payload for m in got] == [b"m0", b"m1", b"m2"]

        # Plain HTTP to the TLS port gets no HTTP answer.
        async with httpx.AsyncClient(trust_env=False) as plain:
            with pytest.raises(httpx.TransportError):
                await plain.get(f"http://127.0.0.1:{port}/readyz")
        # A client that does not trust the CA is refused at once (not retried to its deadline).
        async with AsyncDanubeClient(url, timeout_s=5) as stranger:
            with pytest.raises(TransportError) as refused:
                await stranger.admin.lookup("/default/secure")
        assert refused.value.retriable is False
        assert "CERTIFICATE_VERIFY_FAILED" in refused.value.message

        # gRPC on the same certificate; lookups advertise https://.
        grpc_url = f"https://127.0.0.1:{grpc_port}"
        credentials = channel_credentials(pki.ca.cert)
        async with WireClient(grpc_url, credentials=credentials, timeout_s=10) as wire:
            producer_id = await wire.create_producer("/default/secure", "g")
            await wire.send("/default/secure", producer_id, "g", b"over grpc")
        async with WireClient(f"http://127.0.0.1:{grpc_port}", timeout_s=3) as insecure:
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await insecure.create_producer("/default/secure", "h")
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE

        # `danube bench grpc` over TLS on both APIs.
        result = await grpc_compare.compare(
            url, grpc_url, size=16, count=5, producers=1, tls=ClientTls(ca_file=pki.ca.cert)
        )
        assert (result["grpc"]["consumed"], result["http"]["consumed"]) == (5, 5)

        # Ingest's health and metrics port serves HTTPS too.
        health_url = f"https://127.0.0.1:{settings.ingest.metrics_port}"
        async with httpx.AsyncClient(verify=client_context(pki.ca.cert)) as http:
            assert (await http.get(f"{health_url}/readyz")).status_code == 200
            metrics = await http.get(f"{health_url}/metrics")
            assert metrics.status_code == 200
            assert "# TYPE" in metrics.text
        async with httpx.AsyncClient(trust_env=False) as plain:
            with pytest.raises(httpx.TransportError):
                await plain.get(f"http://127.0.0.1:{settings.ingest.metrics_port}/readyz")


async def test_mtls_required_on_discovery_refuses_clients_without_a_certificate(
    mesh_settings: MeshSettings, pki: LocalPki
) -> None:
    async with tls_mesh(mesh_settings, server_tls(pki, "required")) as settings:
        url = f"https://127.0.0.1:{settings.discovery.port}"
        async with AsyncDanubeClient(url, tls=ClientTls(ca_file=pki.ca.cert), timeout_s=5) as anon:
            # TLS 1.3: the server refuses after the client's handshake ends, so the client
            # sees its connection closed rather than a certificate error.
            with pytest.raises(TransportError):
                await anon.admin.lookup("/default/nothing")
        alice = pki.clients["alice"]
        tls = ClientTls(ca_file=pki.ca.cert, cert_file=alice.cert, key_file=alice.key)
        async with AsyncDanubeClient(url, tls=tls) as client:
            await client.admin.create_topic("/default/mutual", partitions=0)
            async with client.producer("/default/mutual") as producer:
                assert (await producer.send_and_wait(b"x")).offset == 0

        # The blocking client takes the same options.
        def blocking_lookup() -> int:
            with DanubeClient(url, tls=tls) as client:
                return len(client.admin.lookup("/default/mutual").partitions)

        assert await asyncio.to_thread(blocking_lookup) == 1

        # The CLI: TLS options of the root command, or their environment variables.
        code, out, err = await danube(
            "--ca-file", str(pki.ca.cert), "--cert-file", str(alice.cert),
            "--key-file", str(alice.key),
            "produce", "-s", url, "-t", "/default/mutual", "-m", "from the cli",
        )  # fmt: skip
        assert code == 0, err
        env = {"DANUBE_CA_FILE": str(pki.ca.cert), "DANUBE_CERT_FILE": str(alice.cert)}
        env["DANUBE_KEY_FILE"] = str(alice.key)
        code, out, err = await danube(
            "admin", "topics", "lookup", "/default/mutual", "-s", url, env=env
        )
        assert code == 0, err
        assert "/default/mutual" in out
        no_cert = ["--ca-file", str(pki.ca.cert), "produce", "-s", url, "-t", "/default/mutual"]
        code, _, err = await danube(*no_cert, "-m", "x", "--timeout", "1")
        assert code == 1
        assert "cannot reach the server" in err

        grpc_port = settings.discovery.grpc_port
        anonymous = channel_credentials(pki.ca.cert)
        async with WireClient(f"https://127.0.0.1:{grpc_port}", credentials=anonymous) as wire:
            wire.timeout_s = 3
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await wire.create_producer("/default/mutual", "g")
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        mutual = channel_credentials(pki.ca.cert, alice.cert, alice.key)
        async with WireClient(f"https://127.0.0.1:{grpc_port}", credentials=mutual) as wire:
            producer_id = await wire.create_producer("/default/mutual", "g")
            await wire.send("/default/mutual", producer_id, "g", b"y")


async def danube(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run the `danube` console script; its exit code, stdout and stderr."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DANUBE_")}
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "danube"),
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**environ, "NO_COLOR": "1", "COLUMNS": "200", **(env or {})},
    )
    async with asyncio.timeout(60):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


# --- the transport principal ------------------------------------------------------------


async def test_required_client_certificate_names_the_principal_over_http_and_websocket(
    pki: LocalPki,
) -> None:
    alice = client_context(pki.ca.cert, pki.clients["alice"])
    async with whoami_server(server_tls(pki, "required")) as port:
        assert await whoami(port, alice) == "alice"
        assert await whoami_ws(port, alice) == "alice"
        with pytest.raises(httpx.TransportError):
            await whoami(port, client_context(pki.ca.cert))
        # A certificate from another CA is refused as well.
        other = ensure_local_pki(pki.dir.parent / "other", HOSTS, clients=["mallory"])
        with pytest.raises(httpx.TransportError):
            await whoami(port, client_context(pki.ca.cert, other.clients["mallory"]))


async def test_optional_client_certificate_lets_both_in(pki: LocalPki) -> None:
    async with whoami_server(server_tls(pki, "optional")) as port:
        assert await whoami(port, client_context(pki.ca.cert, pki.clients["alice"])) == "alice"
        assert await whoami(port, client_context(pki.ca.cert)) is None
        assert await whoami_ws(port, client_context(pki.ca.cert)) is None


async def test_without_client_auth_no_principal_even_with_a_certificate(pki: LocalPki) -> None:
    async with whoami_server(server_tls(pki)) as port:
        assert await whoami(port, client_context(pki.ca.cert, pki.clients["alice"])) is None


@contextlib.asynccontextmanager
async def grpc_whoami(tls: TlsConfig) -> AsyncIterator[int]:
    async def echo(_request: bytes, context: Any) -> bytes:
        return (grpc_tls_principal(context) or "").encode()

    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(echo)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("t.T", {"E": handler})])
    port = server.add_secure_port("127.0.0.1:0", grpc_server_credentials(tls))
    await server.start()
    try:
        yield port
    finally:
        await server.stop(0)


async def grpc_whoami_call(port: int, credentials: grpc.ChannelCredentials) -> str:
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
        answer: bytes = await channel.unary_unary("/t.T/E")(b"", timeout=5)
        return answer.decode()


async def test_grpc_principal_under_required_and_none_under_optional(pki: LocalPki) -> None:
    alice = pki.clients["alice"]
    with_cert = channel_credentials(pki.ca.cert, alice.cert, alice.key)
    async with grpc_whoami(server_tls(pki, "required")) as port:
        assert await grpc_whoami_call(port, with_cert) == "alice"
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await grpc_whoami_call(port, channel_credentials(pki.ca.cert))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    # grpcio does not ask for a client certificate unless it requires one (docs/security.md).
    async with grpc_whoami(server_tls(pki, "optional")) as port:
        assert await grpc_whoami_call(port, with_cert) == ""
        assert await grpc_whoami_call(port, channel_credentials(pki.ca.cert)) == ""


# --- certificates reloaded from their files ---------------------------------------------


def replace_server_certificate(pki: LocalPki, ca: CertPaths) -> None:
    """Issue a new server certificate from ``ca`` and move it over the served files the way
    a renewal does (a rename, so no reader sees half a file)."""
    staged = CertPaths(pki.dir / "next.pem", pki.dir / "next-key.pem")
    issue_server_cert(ca, staged, HOSTS)
    staged.key.replace(pki.server.key)
    staged.cert.replace(pki.server.cert)


async def test_new_connections_get_the_replaced_certificate(pki: LocalPki) -> None:
    old_ca = client_context(pki.ca.cert)
    async with whoami_server(server_tls(pki, reload_s=0.0)) as port:
        before = await peer_certificate(port, old_ca)
        assert await peer_certificate(port, old_ca) == before  # unchanged files: same cert

        # A new certificate from a new CA: clients trusting only the old CA are refused.
        new_ca = create_ca(pki.dir / "ca2.pem", pki.dir / "ca2-key.pem")
        replace_server_certificate(pki, new_ca)
        after = await peer_certificate(port, client_context(new_ca.cert))
        assert after != before
        with pytest.raises(ssl.SSLCertVerificationError):
            await peer_certificate(port, old_ca)

        # A file that does not load (half written) keeps the certificate served until now.
        pki.server.cert.write_text("-----BEGIN CERTIFICATE-----\ntruncated")
        assert await peer_certificate(port, client_context(new_ca.cert)) == after


async def test_grpc_serves_the_replaced_certificate_to_new_channels(pki: LocalPki) -> None:
    async with grpc_whoami(server_tls(pki, reload_s=0.0)) as port:
        assert await grpc_whoami_call(port, channel_credentials(pki.ca.cert)) == ""
        new_ca = create_ca(pki.dir / "ca2.pem", pki.dir / "ca2-key.pem")
        replace_server_certificate(pki, new_ca)
        assert await grpc_whoami_call(port, channel_credentials(new_ca.cert)) == ""
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await grpc_whoami_call(port, channel_credentials(pki.ca.cert))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_health_server_over_tls(pki: LocalPki) -> None:
    health = HealthServer(
        "127.0.0.1", 0, ready=lambda: True, limits=ServiceConfig(tls=server_tls(pki))
    )
    serving = asyncio.create_task(health.serve())
    try:
        await health.wait_started(serving, 10.0)
        url = f"https://127.0.0.1:{health.port}"
        async with httpx.AsyncClient(verify=client_context(pki.ca.cert)) as http:
            assert (await http.get(f"{url}/healthz")).json() == {"status": "ok"}
        # The container healthcheck follows the https:// URL the service writes.
        probe = probe_url("127.0.0.1", health.port, tls=True)
        assert probe == f"{url}/readyz"
        path = write_health_file("n1", probe, path=pki.dir / "health.json")
        assert path is not None
        assert await asyncio.to_thread(check, read_health_url(path)) is None
        async with httpx.AsyncClient(trust_env=False) as plain:
            with pytest.raises(httpx.TransportError):
                await plain.get(f"http://127.0.0.1:{health.port}/healthz")
    finally:
        health.stop()
        await serving


def test_missing_certificate_file_fails_the_listener_at_start(tmp_path: Path) -> None:
    tls = TlsConfig(cert_file=tmp_path / "absent.pem", key_file=tmp_path / "absent-key.pem")
    with pytest.raises(TlsError, match=r"absent\.pem"):
        uvicorn_tls(tls)
    with pytest.raises(TlsError, match=r"absent\.pem"):
        grpc_server_credentials(tls)
