"""The SDK's one HTTP seam: an ``httpx.AsyncClient``, JSON in and out, and the mapping of
every failure to :mod:`danube.client.errors`. Tests plug a fake in through ``transport``.

The producer's posts (``lean=True``) go through :mod:`danube.wire.http1` instead (a kept-
alive HTTP/1.1 connection, a fraction of httpx's CPU per request) unless a transport is
plugged in; their answers and errors map the same way."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import orjson

from danube.client.errors import (
    ClientError,
    DeadlineExceededError,
    ProtocolError,
    TransportError,
    error_from_body,
)
from danube.client.retry import RetryPolicy, is_retriable, retrying
from danube.wire.http1 import Http1Pool

if TYPE_CHECKING:
    # httpx is imported with the client made at the first request that needs it (below).
    import httpx

_JSON = {"content-type": "application/json"}
# The start of a non-JSON answer shown in an error (a proxy's HTML page, say).
_SHOWN_BYTES = 200
# Connections to one server at most; produce, consume and acks share them.
MAX_CONNECTIONS = 32
# Targets (path and query) remembered per core, at most (a producer posts a few).
TARGETS_MAX = 256


@dataclass(frozen=True, slots=True)
class Answer:
    """A successful answer: its status (``201`` created, ``200`` existed...) and JSON body
    (None when empty)."""

    status: int
    body: Any


class HttpCore:
    """Requests to one Danube server (any discovery instance): ``base_url`` such as
    ``http://127.0.0.1:8080``. ``timeout_s`` bounds each request unless a call says otherwise."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float,
        retry: RetryPolicy,
        transport: httpx.AsyncBaseTransport | None = None,
        ssl_context: ssl.SSLContext | None = None,
        token: str | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.retry = retry
        # The one context of https:// requests and wss:// streams (None: the system's CAs).
        self.ssl_context = ssl_context
        self._token = token
        # Sent on every request and WebSocket upgrade (security.enabled servers).
        self.auth_headers: dict[str, str] = (
            {} if token is None else {"authorization": f"Bearer {token}"}
        )
        # trust_env=False: a proxy set for the shell must not catch a broker on localhost.
        self._client_options: dict[str, Any] = {
            "base_url": self.base_url,
            "transport": transport,
            "trust_env": False,
            "verify": ssl_context if ssl_context is not None else True,
            "headers": self.auth_headers,
        }
        self._httpx: httpx.AsyncClient | None = None
        self._closed = False
        self._targets: dict[tuple[object, ...], str] = {}
        # The lean client of the producer's posts; none when a test plugs in a transport.
        self._wire: Http1Pool | None = None
        if transport is None:
            self._wire = Http1Pool(
                self.base_url, ssl_context=ssl_context, headers=self.auth_headers
            )

    def sibling(self, base_url: str) -> HttpCore:
        """A core for another server of the same cluster (a data door): the same deadline,
        retry policy, TLS context, token and transport (a test's)."""
        return HttpCore(
            base_url,
            timeout_s=self.timeout_s,
            retry=self.retry,
            transport=self._client_options["transport"],
            ssl_context=self.ssl_context,
            token=self._token,
        )

    @property
    def _client(self) -> httpx.AsyncClient:
        # Made at the first request that needs it: httpx and its transport (httpcore,
        # anyio) cost about 0.1 s to import, which a producer posting through the lean
        # client never pays (`danube produce` to its first byte, docs/cli.md "Start time").
        if self._httpx is None:
            if self._closed:  # as httpx answers a request after aclose()
                raise RuntimeError("Cannot send a request, as the client has been closed.")
            import httpx

            limits = httpx.Limits(
                max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_CONNECTIONS
            )
            self._httpx = httpx.AsyncClient(limits=limits, **self._client_options)
        return self._httpx

    def ws_url(self, path: str) -> str:
        """The WebSocket URL of ``path`` on this server."""
        if self.base_url.startswith("https://"):
            return "wss://" + self.base_url[len("https://") :] + path
        return "ws://" + self.base_url.removeprefix("http://") + path

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content: bytes | None = None,
        content_type: str | None = None,
        params: Mapping[str, str | int] | None = None,
        timeout_s: float | None = None,
        accept: str | None = None,
        lean: bool = False,
    ) -> Answer:
        """One attempt: the answer, or the error the server answered, or
        :class:`TransportError` when no answer came within the timeout. ``content`` is
        sent as JSON unless ``content_type`` says otherwise; ``accept``: a media type asked
        for besides JSON; an answer of that type has its raw bytes as body. ``lean``: a
        POST of ``content`` with a JSON answer, sent by the lean client when there is one."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        if body is not None:
            content = orjson.dumps(body)
        if lean and self._wire is not None and content is not None and accept is None:
            return await self._lean(method, path, content, content_type, params, timeout)
        import httpx  # loaded by self._client already: for the errors below

        headers: dict[str, str] | None = None
        if content is not None:
            headers = _JSON if content_type is None else {"content-type": content_type}
        if accept is not None:
            headers = {**(headers or {}), "accept": f"{accept}, application/json;q=0.5"}
        try:
            async with asyncio.timeout(timeout):
                response = await self._client.request(
                    method,
                    path,
                    content=content,
                    params=params,
                    headers=headers,
                    timeout=timeout,
                )
        except TimeoutError as exc:
            raise TransportError(f"{method} {path}: no answer within {timeout:.1f} s") from exc
        except httpx.TimeoutException as exc:
            raise TransportError(f"{method} {path}: no answer within {timeout:.1f} s") from exc
        except httpx.TransportError as exc:
            # A certificate refused (either way) stays refused: no point in retrying.
            tls_refused = _caused_by(exc, ssl.SSLError)
            raise TransportError(
                f"{method} {path}: {self.base_url}: {exc!r}",
                retriable=False if tls_refused else None,
            ) from exc
        content_type = response.headers.get("content-type", "")
        if accept is not None and response.is_success and content_type.startswith(accept):
            return Answer(response.status_code, response.content)
        return _decode(method, path, response)

    async def request_retrying(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content: bytes | None = None,
        content_type: str | None = None,
        params: Mapping[str, str | int] | None = None,
        timeout_s: float,
        attempt_timeout_s: float | None = None,
        lean: bool = False,
        retry_if: Callable[[ClientError], bool] = is_retriable,
    ) -> Answer:
        """:meth:`request`, retrying 429, 503 and transport failures (those ``retry_if``
        accepts) within ``timeout_s``."""
        if body is not None:
            content = orjson.dumps(body)
        cap = self.timeout_s if attempt_timeout_s is None else attempt_timeout_s

        async def attempt(left_s: float) -> Answer:
            return await self.request(
                method,
                path,
                content=content,
                content_type=content_type,
                params=params,
                timeout_s=min(cap, left_s),
                lean=lean,
            )

        return await retrying(
            attempt,
            timeout_s=timeout_s,
            policy=self.retry,
            what=f"{method} {path}",
            retry_if=retry_if,
        )

    async def _lean(
        self,
        method: str,
        path: str,
        content: bytes,
        content_type: str | None,
        params: Mapping[str, str | int] | None,
        timeout_s: float,
    ) -> Answer:
        assert self._wire is not None
        timeout = timeout_s
        target = path if not params else self._target(path, params)
        try:
            async with asyncio.timeout(timeout):
                answer = await self._wire.request(
                    method, target, content_type=content_type or "application/json", body=content
                )
        except TimeoutError as exc:
            raise TransportError(f"{method} {path}: no answer within {timeout:.1f} s") from exc
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            tls_refused = _caused_by(exc, ssl.SSLError)
            raise TransportError(
                f"{method} {path}: {self.base_url}: {exc!r}",
                retriable=False if tls_refused else None,
            ) from exc
        return _answer(method, path, answer.status, answer.body)

    def _target(self, path: str, params: Mapping[str, str | int]) -> str:
        """``path?query``, remembered: a producer posts the same few targets again and
        again (its partitions, its epoch's parameters), and quoting costs a few µs."""
        key = (path, *params.items())
        target = self._targets.get(key)
        if target is None:
            if len(self._targets) >= TARGETS_MAX:
                self._targets.clear()
            target = self._targets[key] = f"{path}?{urlencode(params)}"
        return target

    async def aclose(self) -> None:
        """Close the connections."""
        self._closed = True
        if self._wire is not None:
            await self._wire.aclose()
        if self._httpx is not None:
            await self._httpx.aclose()


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    seen: BaseException | None = exc
    for _ in range(8):  # a cause chain is short; a cycle must not loop
        if seen is None:
            return False
        if isinstance(seen, kind):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _decode(method: str, path: str, response: httpx.Response) -> Answer:
    return _answer(method, path, response.status_code, response.content)


def _answer(method: str, path: str, status: int, content: bytes) -> Answer:
    success = 200 <= status < 300
    try:
        decoded = orjson.loads(content) if content else None
    except orjson.JSONDecodeError:
        shown = content[:_SHOWN_BYTES].decode("utf-8", "replace")
        if success:
            raise ProtocolError(f"{method} {path}: answer is not JSON: {shown!r}") from None
        decoded = None
    if success:
        return Answer(status, decoded)
    shown = content[:_SHOWN_BYTES].decode("utf-8", "replace")
    raise error_from_body(status, decoded, fallback=shown)


def deadline_error(what: str, timeout_s: float) -> ClientError:
    """The error of a client deadline (a receive, a flush) that passed."""
    return DeadlineExceededError(f"{what}: nothing within {timeout_s:.1f} s")
