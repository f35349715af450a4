"""The admin console (docs/console.md): a page and its script, served at ``/console`` by
the same app as the API they call.

The files under ``static/`` are the sources as they are served (no build step): plain HTML,
CSS and JavaScript, read once when the app is built and answered from memory. The page calls
the public JSON API only (``/v1/...``, with the operator's bearer token when one is given),
so it can do nothing the CLI cannot, and it loads nothing from elsewhere (the page works
offline; the Content-Security-Policy says so to the browser).
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

from danube.discovery.errors import NotFoundError

# What the page may load and call: only this origin; no inline script, no frames.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
# The static files, all of them small: a bound on what is held in memory.
STATIC_BYTES_MAX = 1 << 20


def load_static() -> dict[str, tuple[bytes, str]]:
    """``{file name: (bytes, media type)}`` of the console's static files."""
    files: dict[str, tuple[bytes, str]] = {}
    total = 0
    for entry in resources.files(__name__).joinpath("static").iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if not entry.is_file() or suffix not in _MEDIA_TYPES:
            continue
        body = entry.read_bytes()
        total += len(body)
        files[entry.name] = (body, _MEDIA_TYPES[suffix])
    if total > STATIC_BYTES_MAX or "index.html" not in files:
        raise RuntimeError(f"console static files: {total} bytes, {sorted(files)}")
    return files


def _answer(found: tuple[bytes, str]) -> Response:
    body, media_type = found
    return Response(
        body,
        media_type=media_type,
        headers={
            "content-security-policy": CONTENT_SECURITY_POLICY,
            "x-content-type-options": "nosniff",
            "referrer-policy": "no-referrer",
            # Small files: always asked again, so an upgrade is seen at the next load.
            "cache-control": "no-cache",
        },
    )


def build_router() -> APIRouter:
    """The routes of the console's files (left out of the OpenAPI: they are no API)."""
    files = load_static()
    router = APIRouter(include_in_schema=False)

    async def console_page() -> Response:
        return _answer(files["index.html"])

    # The page uses absolute paths, so it works at either.
    router.add_api_route("/console", console_page, methods=["GET"])
    router.add_api_route("/console/", console_page, methods=["GET"])

    @router.get("/console/static/{name}")
    async def console_file(name: str) -> Response:
        found = files.get(name)
        if found is None:
            raise NotFoundError(f"no console file {name[:100]!r}")
        return _answer(found)

    return router
