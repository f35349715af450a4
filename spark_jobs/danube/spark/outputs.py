"""A job's output that appears whole or not at all: written aside, then renamed into place.

Spark writes a dataset file by file, and a failed job leaves what it wrote (at least an empty
directory) at the output, in the way of its own re-run. Here the job writes to a directory
beside the output, on the same filesystem::

    <parent>/.<name>.danube-<id>.tmp/     while the job writes
    <parent>/<name>/                      after publish(): one rename

The paths go through Hadoop's FileSystem API (the JVM's, as Spark's own writes), so any
path Spark writes to works: local files, HDFS, and object stores through their Hadoop
connector (where a rename is a copy: whole at the end still, but not instant).
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterator
from typing import Any, Literal

from pyspark.sql import SparkSession

from danube.spark.errors import InvalidOptionError, SparkJobError

log = logging.getLogger(__name__)

PublishMode = Literal["error", "overwrite", "append"]
ASIDE_SUFFIX = ".tmp"  # .<name>.danube-<id>.tmp: Spark and Hive readers skip dot names


def exists_error(output: str) -> InvalidOptionError:
    """What a job in mode ``error`` says of an output that exists."""
    instead = "--mode overwrite replaces it, --mode append adds to it"
    return InvalidOptionError("output", f"{output} already exists ({instead})")


class Output:
    """One output path of a job, and the aside directory the job writes first."""

    def __init__(self, spark: SparkSession, output: str) -> None:
        jvm: Any = spark._jvm  # Spark's own gateway to the driver's JVM
        self._path_class = jvm.org.apache.hadoop.fs.Path
        path = self._path_class(output)
        self._fs = path.getFileSystem(spark._jsc.hadoopConfiguration())
        self._target = self._fs.makeQualified(path)
        if self._target.getParent() is None:
            raise InvalidOptionError("output", f"{output!r}: a directory below the root")
        self._shown = output
        self._aside: Any = None

    @property
    def path(self) -> str:
        """The output, qualified (``file:/...``, ``hdfs://...``)."""
        return str(self._target.toString())

    def remove(self) -> None:
        """Delete the output if it exists (a job's own output it cannot use)."""
        self._delete(self._target)

    def check_absent(self) -> None:
        """Raise :func:`exists_error` if the output exists."""
        if self._fs.exists(self._target):
            raise exists_error(self._shown)

    @contextlib.contextmanager
    def aside(self) -> Iterator[str]:
        """The path to write to instead of the output; whatever is left there at the end of
        the block (a failed write, or nothing after :meth:`publish`) is deleted."""
        if self._aside is not None:
            raise RuntimeError("one aside directory at a time")
        aside = self._sibling(ASIDE_SUFFIX)
        self._aside = aside
        try:
            yield str(aside.toString())
        finally:
            self._aside = None
            self._delete(aside)

    def publish(self, mode: PublishMode) -> None:
        """Put what was written aside in place: rename it to the output (``error``, or any
        mode when there is no output yet), replace the output (``overwrite``: the old one is
        renamed away first, then deleted), or move its files into it (``append``: one rename
        per file; Spark's file names are unique per job)."""
        aside = self._aside
        if aside is None:
            raise RuntimeError("publish() inside aside()")
        if not self._fs.exists(self._target):
            self._rename(aside, self._target)
        elif mode == "error":
            self.check_absent()
        elif mode == "overwrite":
            old = self._sibling(".old")
            self._rename(self._target, old)
            try:
                self._rename(aside, self._target)
            except SparkJobError:
                self._rename(old, self._target)  # the previous output back where it was
                raise
            self._delete(old)
        else:
            self._move_files(aside)
        log.info("output %s published (%s)", self._shown, mode)

    def _sibling(self, suffix: str) -> Any:
        name = f".{self._target.getName()}.danube-{uuid.uuid4().hex[:12]}{suffix}"
        return self._path_class(self._target.getParent(), name)

    def _move_files(self, aside: Any) -> None:
        root = str(aside.toUri().getPath()).rstrip("/") + "/"
        files = self._fs.listFiles(aside, True)
        moves = []
        while files.hasNext():
            path = files.next().getPath()
            relative = str(path.toUri().getPath())[len(root) :]
            # _SUCCESS marks the aside job; .crc files follow their file in a rename.
            if not any(part.startswith(("_", ".")) for part in relative.split("/")):
                moves.append((path, self._path_class(self._target, relative)))
        for source, destination in moves:
            self._fs.mkdirs(destination.getParent())
            self._rename(source, destination)

    def _rename(self, source: Any, destination: Any) -> None:
        if self._fs.exists(destination) or not self._fs.rename(source, destination):
            raise SparkJobError(
                f"output {self._shown}: could not rename {source.toString()} to "
                f"{destination.toString()}"
            )

    def _delete(self, path: Any) -> None:
        try:
            if self._fs.exists(path):
                self._fs.delete(path, True)
        except Exception as exc:  # py4j's errors: the job's own outcome matters more
            log.warning("could not delete %s: %s", path.toString(), exc)
