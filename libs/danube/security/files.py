"""What changes when a file the process reloads is replaced: for TLS certificates
(danube.security.tls.FileWatch) and token key directories (discovery's key reload)."""

from __future__ import annotations

import os
from pathlib import Path

FileStamp = tuple[int, int, int]
"""A file's modification time (ns), size and inode: any of them moves when it is rewritten
or replaced by a rename."""

DirStamp = tuple[tuple[str, FileStamp | None], ...]


def file_stamp(path: Path) -> FileStamp | None:
    """The stamp of ``path``; None when it is not there (vanished while being replaced)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def dir_stamp(directory: Path) -> DirStamp:
    """The stamp of every file in ``directory`` by name: moves when one is added, removed,
    rewritten or replaced. OSError when the directory cannot be listed."""
    return tuple(sorted((path.name, file_stamp(path)) for path in directory.iterdir()))
