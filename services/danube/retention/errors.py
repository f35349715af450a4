"""Errors of the retention service.

::

    DanubeError
    └── RetentionError         "retention_error"
        └── DeposedError       "deposed": a fenced delete failed, another node leads now

Everything else a pass meets (bus, etcd, storage errors) keeps its own class and code; the
pass counts it by stage and goes on with the next partition.
"""

from __future__ import annotations

from danube.errors import DanubeError


class RetentionError(DanubeError):
    """Root of the retention service's own errors."""

    code = "retention_error"


class DeposedError(RetentionError):
    """A delete fenced on the election failed: this node no longer leads; the pass stops."""

    code = "deposed"
