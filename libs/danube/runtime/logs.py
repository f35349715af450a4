"""Process-level logging setup: one JSON object per line, for service processes.

Libraries only call ``logging.getLogger(__name__)``; a process entry point calls
``configure_logging`` once. The supervisor prefixes each line with the process
name, and log shippers can parse the JSON as is. A line logged while a request is served
carries that request's ``trace_id`` (danube.trace).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

from danube.trace import TraceIdFilter

# LogRecord attributes that are not user-supplied `extra=` fields.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message"}


class JsonFormatter(logging.Formatter):
    """``{"ts": ..., "level": ..., "logger": ..., "msg": ..., **extra}`` on one line."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(doc, default=str).decode()


def configure_logging(service: str, *, level: str = "INFO", json_lines: bool = True) -> None:
    """Send the root logger to stderr, as JSON lines unless ``json_lines`` is False."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(TraceIdFilter())
    if json_lines:
        handler.setFormatter(JsonFormatter(service))
    else:
        handler.setFormatter(_PlainFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


class _PlainFormatter(logging.Formatter):
    """The human format, with `` [trace <id>]`` after a line logged within a request."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        trace_id = record.__dict__.get("trace_id")
        return line if trace_id is None else f"{line} [trace {trace_id}]"
