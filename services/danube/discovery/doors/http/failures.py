"""The app's exception handlers: every error a request meets becomes the one error body,
with the status and code :mod:`danube.discovery.errors` gives it (the one map).

- errors of the mesh (``DanubeError``) and timeouts: by their code;
- request validation: ``invalid_json``, ``unknown_field`` or ``invalid_request``, the message
  naming the first bad field by its path (``retention.time_minutes: ...``); a body that is not
  sent as JSON is ``415 unsupported_media_type``;
- what the framework answers by itself (no route, a method the path does not serve, a body
  that does not parse): by its status; a 405 lists in ``Allow`` every method the path serves;
- anything else is a bug: ``500 internal``, logged, nothing more said.
"""

from __future__ import annotations

import email.message
import logging
import re
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from danube.discovery.errors import (
    UnsupportedMediaTypeError,
    error_body,
    http_status,
    status_code,
)
from danube.errors import DanubeError
from danube.wire.http_errors import error_headers
from danube.wire.validation import location, validation_code, validation_message

log = logging.getLogger(__name__)


def install(app: FastAPI) -> None:
    """Register the handlers on ``app``."""
    app.add_exception_handler(DanubeError, _on_danube_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(HTTPException, _on_http_error)
    app.add_exception_handler(TimeoutError, _on_danube_error)
    # Starlette answers with this handler, then re-raises (the server logs the traceback).
    app.add_exception_handler(Exception, _on_bug)


def _answer(
    status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    body = {"error": {"code": code, "message": message}}
    return JSONResponse(body, status_code=status, headers=headers)


def danube_error_answer(exc: Exception) -> tuple[int, dict[str, Any], dict[str, str] | None]:
    """The status, body and extra headers a mesh error or a timeout is answered with."""
    status = http_status(exc)
    if status >= 500:
        log.warning("answered %d: %r", status, exc)
    return status, error_body(exc), error_headers(exc)


async def _on_danube_error(_: Request, exc: Exception) -> Response:
    status, body, headers = danube_error_answer(exc)
    return JSONResponse(body, status_code=status, headers=headers)


async def _on_bug(_: Request, exc: Exception) -> Response:
    return JSONResponse(error_body(exc), status_code=500)


def is_json(content_type: str | None) -> bool:
    """Whether a ``Content-Type`` is JSON as FastAPI reads it (``application/json`` or
    ``application/*+json``); FastAPI does not parse a body sent with no type at all."""
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


async def _on_validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    content_type = request.headers.get("content-type")
    if any(location(e)[:1] == ("body",) for e in errors) and not is_json(content_type):
        sent = f"Content-Type {content_type[:100]!r}" if content_type else "no Content-Type"
        refusal = UnsupportedMediaTypeError(
            f"the body must be JSON, sent with Content-Type: application/json (got {sent})"
        )
        return JSONResponse(error_body(refusal), status_code=http_status(refusal))
    return _answer(400, validation_code(errors), validation_message(errors))


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    status = exc.status_code
    message = str(exc.detail)
    headers = dict(exc.headers or {})
    if status == 405:
        headers["Allow"] = ", ".join(allowed_methods(request))
    elif status == 400:
        # FastAPI could not read the body as JSON; the cause says why.
        cause = exc.__cause__
        if isinstance(cause, RecursionError):
            message = "the body is not JSON this API reads: nested too deeply"
        elif isinstance(cause, UnicodeDecodeError):
            message = "the body is not JSON: it is not valid UTF-8"
        else:
            message = "the body is not JSON"
    return _answer(status, status_code(status), message, headers)


def allowed_methods(request: Request) -> list[str]:
    """Every method the app serves at the request's path (as its OpenAPI gives them, and the
    documentation pages'), sorted."""
    app = request.app
    table: list[tuple[re.Pattern[str], frozenset[str]]] | None = getattr(
        app.state, "methods_by_path", None
    )
    if table is None:
        table = app.state.methods_by_path = _methods_by_path(app)
    path = request.url.path
    return sorted({m for pattern, methods in table if pattern.fullmatch(path) for m in methods})


def _methods_by_path(app: FastAPI) -> list[tuple[re.Pattern[str], frozenset[str]]]:
    table = []
    for template, operations in app.openapi().get("paths", {}).items():
        for method, operation in operations.items():
            table.append((_path_pattern(template, operation), frozenset({method.upper()})))
    for route in app.routes:  # /docs, /openapi.json...: not in the OpenAPI
        methods = getattr(route, "methods", None)
        path = getattr(route, "path", None)
        if methods and isinstance(path, str) and "{" not in path:
            table.append((re.compile(re.escape(path)), frozenset(methods)))
    return table


def _path_pattern(template: str, operation: dict[str, Any]) -> re.Pattern[str]:
    """The paths an operation serves: a path parameter is one segment (digits only when it is
    an integer, as a ``{version:int}`` route matches), the template's other characters are
    literal."""
    integers = {
        p["name"]
        for p in operation.get("parameters", [])
        if p.get("in") == "path" and p.get("schema", {}).get("type") == "integer"
    }
    pattern = ""
    for literal, name in re.findall(r"([^{]*)(?:\{([^}/]+)\})?", template):
        pattern += re.escape(literal)
        if name:
            pattern += "[0-9]+" if name in integers else "[^/]+"
    return re.compile(pattern)
