"""How the admin clients call the server and read its answers: reads and idempotent writes
retried within the client's timeout, a ``DELETE`` tried once (:class:`AdminCalls`), and one
parse that turns a body that does not fit its model into
:class:`~danube.client.errors.ProtocolError`."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from danube.client._http import Answer, HttpCore
from danube.client.errors import ProtocolError

M = TypeVar("M", bound=BaseModel)


def parse_answer(model: type[M], body: Any, what: str) -> M:
    """``body`` as ``model``; ProtocolError naming ``what`` when it does not fit."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise ProtocolError(f"{what}: unexpected answer: {exc.errors()[:1]}") from exc


class AdminCalls:
    """The calls of the admin routes through one server (``_http``). Reads and idempotent
    writes (``PUT``, ``PATCH``) are retried on 429, 503 and transport failures within the
    client's timeout; a ``DELETE`` is tried once (its answer may be lost after it took
    effect, and the retry would then answer 404)."""

    _http: HttpCore

    async def _call(self, method: str, path: str, body: Any = None) -> Answer:
        """One request of a route, retried unless a ``DELETE``."""
        if method == "DELETE":
            return await self._http.request(method, path, body=body)
        return await self._http.request_retrying(
            method, path, body=body, timeout_s=self._http.timeout_s
        )
