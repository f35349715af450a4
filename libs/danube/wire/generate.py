"""Generate the message modules of the wire contract: ``python -m danube.wire.generate``
writes ``<name>_pb2.py`` and ``<name>_pb2.pyi`` beside each ``.proto`` file; ``--check``
writes nothing and exits 1 when a committed module differs from what the ``.proto`` gives.

Needs grpcio-tools (a dev dependency): the protoc it bundles is the one the generated code
was made with.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

WIRE_DIR = Path(__file__).resolve().parent
LIBS_DIR = WIRE_DIR.parent.parent  # the import root: modules import as danube.wire.<name>
PROTOS = sorted(WIRE_DIR.glob("*.proto"))


def generate(out_dir: Path) -> list[Path]:
    """Run protoc over every ``.proto`` into ``out_dir`` (laid out like ``libs/``); return
    the files written, relative to ``out_dir``."""
    from grpc_tools import protoc

    args = [
        "protoc",
        f"-I{LIBS_DIR}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        *(str(p) for p in PROTOS),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {', '.join(p.name for p in PROTOS)}")
    return sorted(p.relative_to(out_dir) for p in out_dir.rglob("*_pb2.py*"))


def stale() -> list[str]:
    """The generated modules that differ from (or are missing beside) their ``.proto``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        return [str(rel) for rel in generate(out) if not _same(LIBS_DIR / rel, out / rel)]


def _same(committed: Path, fresh: Path) -> bool:
    return committed.exists() and committed.read_bytes() == fresh.read_bytes()


def main(argv: list[str]) -> int:
    if argv[1:] == ["--check"]:
        differing = stale()
        for name in differing:
            print(f"stale: {name} (run `make proto`)", file=sys.stderr)
        return 1 if differing else 0
    for rel in generate(LIBS_DIR):
        print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
