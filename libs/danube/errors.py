"""The root of every error the Danube mesh raises on purpose.

Each package draws its own hierarchy under :class:`DanubeError`::

    DanubeError                  code, message, retriable
    ├── names.InvalidNameError   a name that breaks the naming rules (one for every package)
    ├── frame.FrameError         corrupt or oversize frames and records
    ├── config.ConfigError       a bad setting, named by its key path
    ├── bus.BusError             request/reply failures, remote errors
    ├── meta.MetaError           etcd failures, lost leases
    └── storage.StorageError     object storage failures

``code`` is a short stable string (``"corrupt_frame"``, ``"timeout"``...) that
travels over the bus and into HTTP error bodies; ``retriable`` tells a caller
whether the same request may succeed later without any change.
"""

from __future__ import annotations


class DanubeError(Exception):
    """Base class: a stable ``code``, a human ``message`` and a ``retriable`` flag."""

    code: str = "internal"
    retriable: bool = False

    def __init__(
        self, message: str, *, code: str | None = None, retriable: bool | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if retriable is not None:
            self.retriable = retriable

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"
