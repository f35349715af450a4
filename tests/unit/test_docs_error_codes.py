"""docs/http-api.md's error table against the code: every error code the HTTP API can answer
is in the table, and the table names no other (found by reading the source, no server)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from danube.discovery import errors

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
# Where the codes a request can end with are written: the HTTP door and its core, admission
# (every produce door's decision), the dispatcher (its refusals travel back over the bus as
# codes, with their kinds), the bus contracts, the libraries discovery calls while it serves
# a request, and ingest's refusals of a produce (leadership, sequences, limits, its WAL's
# failures).
SOURCES = [
    "services/danube/discovery",
    "libs/danube/admission",
    "services/danube/dispatcher",
    "services/danube/ingest/leadership.py",
    "services/danube/ingest/sequencing.py",
    "services/danube/ingest/handlers.py",
    "services/danube/ingest/quota.py",
    "services/danube/ingest/wal/errors.py",
    "libs/danube/wire",
    "libs/danube/bus/errors.py",
    "libs/danube/meta",
    "libs/danube/frame",
    "libs/danube/schemas",
    "libs/danube/security",
    "libs/danube/names.py",
    "libs/danube/errors.py",
]
# Codes written in those sources that no answer carries, and why.
NEVER_ANSWERED = {
    "security_error": "SecurityError's own: only its subclasses are raised",
    "schema_error": "SchemaError's own: only its subclasses are raised",
    "frame_error": "FrameError's own: raised only with a narrower code",
    "too_large": "TooLargeError is always raised with a code of its own",
    "policy_limit": "PolicyLimitError is always raised with a code of its own",
    "reassign_refused": "ReassignError is always raised with a code of its own",
    "wal_error": "WalError's own: only its subclasses are raised",
    "below_wal_start": "a read below the WAL's start: the reader goes to the cloud tier",
    "copy_unavailable": "a replica's read of another copy; the replica asks again",
    "invalid_offset": "a frame built with an offset past 64 bits: ingest assigns offsets",
    "deposed": "ends the controller's term; no request waits on the controller",
    "stale": "danube.admission.refresh answers from its stale entry instead",
    "http_stopped": "the HTTP server failed to start or stopped: no request to answer",
    "cursors_held": "the dispatcher keeps the cursor dirty and retries (its docstring)",
    "snapshot_corrupt": "a delay snapshot refused: the dispatcher reads its range from the log",
    "pki_error": "making a local CA (danube up --secure), before any request",
    "tls_error": "loading certificates at start or on reload, never inside a request",
    "watch_closed": "etcd watches run in background tasks, not in a request",
    "watch_error": "etcd watches run in background tasks, not in a request",
    "watch_overflow": "etcd watches run in background tasks, not in a request",
}


def _constants(path: Path) -> dict[str, str]:
    """The module's upper-case string constants (``INVALID_SEQUENCE = "invalid_sequence"``):
    codes are constants owned by the contract that answers them, used by name."""
    found: dict[str, str] = {}
    for node in ast.parse(path.read_text(), str(path)).body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id.isupper()
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            found[node.targets[0].id] = node.value.value
    return found


def _code_of(value: ast.expr | None, constants: dict[str, str]) -> str | None:
    """A code written as a literal, or as a constant by name (``X``, ``module.X``)."""
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        return value.value
    name = (
        value.id
        if isinstance(value, ast.Name)
        else value.attr
        if isinstance(value, ast.Attribute)
        else None
    )
    return constants.get(name) if name is not None else None


def _written_codes(path: Path, constants: dict[str, str] | None = None) -> set[str]:
    """`code = "x"` in a class, `code="x"` in a call, `{"code": "x"}`; "x" also as one of
    the sources' constants by name."""
    known = constants if constants is not None else _constants(path)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ClassDef):
            for statement in node.body:
                targets = (
                    statement.targets
                    if isinstance(statement, ast.Assign)
                    else [statement.target]
                    if isinstance(statement, ast.AnnAssign)
                    else []
                )
                named_code = any(isinstance(t, ast.Name) and t.id == "code" for t in targets)
                code = _code_of(getattr(statement, "value", None), known)
                if named_code and code is not None:
                    found.add(code)
        elif isinstance(node, ast.keyword) and node.arg == "code":
            code = _code_of(node.value, known)
            if code is not None:
                found.add(code)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "code":
                    code = _code_of(value, known)
                    if code is not None:
                        found.add(code)
    return found


def _source_files() -> list[Path]:
    files: list[Path] = []
    for source in SOURCES:
        path = REPO / source
        files += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return files


def _all_constants(files: list[Path]) -> dict[str, str]:
    constants: dict[str, str] = {}
    for file in files:
        constants |= _constants(file)
    return constants


def answerable_codes() -> set[str]:
    """Every code an HTTP answer can carry."""
    codes: set[str] = set()
    files = _source_files()
    constants = _all_constants(files)
    for file in files:
        codes |= _written_codes(file, constants)
    # The codes of the statuses the web framework answers by itself.
    codes |= set(errors._CODE_BY_STATUS.values())
    return codes - set(NEVER_ANSWERED)


def documented_codes(text: str) -> dict[str, int]:
    """The codes of the error table of docs/http-api.md (its "Errors" section), and the
    line each is on."""
    section = text.split("\n## Errors\n", 1)[1].split("\n## ", 1)[0]
    start = text.index("\n## Errors\n") + 1
    first_line = text[:start].count("\n") + 2  # the line after the heading
    codes: dict[str, int] = {}
    for number, line in enumerate(section.splitlines(), start=first_line):
        cells = line.split("|")
        if not line.startswith("| ") or len(cells) < 4 or not cells[1].strip().isdigit():
            continue
        for code in re.findall(r"`([a-z_]+)`", cells[2]):
            codes.setdefault(code, number)
    return codes


def test_the_error_table_lists_every_code_the_api_answers_and_no_other() -> None:
    documented = documented_codes((REPO / "docs/http-api.md").read_text())
    answerable = answerable_codes()
    missing = sorted(answerable - set(documented))
    stale = sorted(f"{code} (line {documented[code]})" for code in set(documented) - answerable)
    assert not missing, f"codes the API answers, missing from docs/http-api.md: {missing}"
    assert not stale, f"codes in docs/http-api.md's error table the API never answers: {stale}"


def test_every_code_set_aside_is_still_written_somewhere() -> None:
    # An entry of NEVER_ANSWERED whose code is gone from the sources is stale too.
    written: set[str] = set()
    files = _source_files()
    constants = _all_constants(files)
    for file in files:
        written |= _written_codes(file, constants)
    assert set(NEVER_ANSWERED) - written == set()


def test_the_table_is_found_and_parsed() -> None:
    # The parser itself: a table row's codes, not the words of its "when" column.
    text = "x\n## Errors\n\n| status | codes | when |\n|---|---|---|\n| 404 | `a_b`, `c` | `d` |\n"
    assert documented_codes(text) == {"a_b": 6, "c": 6}
