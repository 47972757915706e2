"""Volt's runtime as the control plane builds it: the pins, the wheelhouse, the image (issue 25 item 2).

The host side (finding, checking and installing a runtime on a host) is inventory/host_runtime.py, which
names this module's public parts for its callers.

- **The pins**: Volt's own `ray`, `torch` and `numpy`, exactly as installed (`2.13.0+cpu` included), and
  its Python minor version. Their key, `ray<ray>-torch<torch>-py<x.y>`, names every copy of the runtime.
- **The wheelhouse**: built once (`<build dir>/wheelhouse/<key>/`, the build dir being
  `VOLT_RUNTIME_BUILD_DIR` or else `VOLT_DATA_DIR`, `pip download --only-binary=:all:`
  of the pins and everything they need, plus pip's own wheel) with a manifest of each wheel's size and
  sha256. Hosts need no internet and no package index.
- **The image**: the same packages installed once from the wheelhouse (`pip install --target`) and packed
  read-only in one squashfs file (`<build dir>/runtime-image/<key>.sqfs`, zstd; needs `mksquashfs`).
  A host that receives it loop-mounts it: nothing is unpacked or compiled there.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from django.conf import settings

from inventory.drivers.base import DriverError

# boto3: volt_store, the jobs' client of the checkpoint store (issue 27).
PINNED = ("ray", "torch", "numpy", "boto3")
MANIFEST = "MANIFEST.json"
INSTALL_TIMEOUT_S = 1800


class RuntimeProblem(DriverError):
    """A host's runtime is missing, does not match Volt's pins, or could not be installed."""

    code = "runtime"


def pins() -> dict[str, str]:
    """Volt's own Ray, torch, numpy and boto3, exactly as installed: what every runtime must hold."""
    return {name: metadata.version(name) for name in PINNED}


def python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def key() -> str:
    """`ray2.60.0-torch2.13.0-boto3-1.44.18-py3.11`: names the runtime everywhere (the local runtime's folder too)."""
    versions = pins()
    return (
        f"ray{versions['ray']}-torch{versions['torch'].split('+')[0]}-boto3-{versions['boto3']}"
        f"-py{python_version()}"
    )


def requirements() -> list[str]:
    versions = pins()
    # torch by exact version without its local label: `torch==2.13.0` takes the CPU build from the index
    # (a bare `torch` could be a CUDA one); the wheel's label is checked afterwards, with the others.
    return [
        f"ray[default]=={versions['ray']}",
        f"torch=={versions['torch'].split('+')[0]}",
        f"numpy=={versions['numpy']}",
        f"boto3=={versions['boto3']}",
    ]


# --- the wheelhouse (control plane) ------------------------------------------------------------------


@dataclass(frozen=True)
class Wheelhouse:
    path: Path
    files: dict[str, dict]  # wheel file name -> {"size", "sha256"}

    @property
    def size(self) -> int:
        return sum(entry["size"] for entry in self.files.values())

    @property
    def pip_wheel(self) -> str:
        return next(name for name in self.files if name.startswith("pip-"))


def build_dir() -> Path:
    """Where the wheelhouse and the image are kept: VOLT_RUNTIME_BUILD_DIR, else VOLT_DATA_DIR."""
    return Path(settings.VOLT_RUNTIME_BUILD_DIR or settings.VOLT_DATA_DIR)


def wheelhouse_path() -> Path:
    return build_dir() / "wheelhouse" / key()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_wheelhouse(where: Path | None = None) -> Wheelhouse | None:
    """The wheelhouse at `where` if its manifest is there and every wheel it lists has its size."""
    where = Path(where or wheelhouse_path())
    try:
        files = json.loads((where / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError):
        return None
    for name, entry in files.items():
        try:
            if (where / name).stat().st_size != entry["size"]:
                return None
        except OSError:
            return None
    return Wheelhouse(where, files)


@contextmanager
def _one_build(where: Path) -> Iterator[None]:
    """Held while `where` is built: concurrent builders (workers bootstrapping several hosts) wait on a
    lock file beside it, then find it built."""
    where.parent.mkdir(parents=True, exist_ok=True)
    with open(where.parent / f"{where.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build_wheelhouse(log: Callable[[str], None] = lambda _: None) -> Wheelhouse:
    """The wheelhouse of Volt's pins, built once (`pip download` from Volt's configured index) and kept.

    Concurrent callers (workers bootstrapping several hosts) wait for one build: a lock file beside it.
    """
    where = wheelhouse_path()
    with _one_build(where):
        built = load_wheelhouse(where)
        if built is not None:
            return built
        building = where.with_name(f"{where.name}.building-{os.getpid()}")
        shutil.rmtree(building, ignore_errors=True)
        shutil.rmtree(where, ignore_errors=True)
        try:
            started = time.monotonic()
            log(f"building the wheelhouse of {', '.join(requirements())} in {where}")
            command = [
                sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-input",
                "--only-binary=:all:", "--dest", str(building), *requirements(), f"pip=={metadata.version('pip')}",
            ]  # fmt: skip
            result = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
            if result.returncode != 0:
                raise RuntimeProblem(
                    f"could not build the runtime's wheelhouse (pip download failed): "
                    f"{(result.stderr or result.stdout).strip()[-600:]}. Volt's machine needs its package "
                    "index (or pip's find-links) for this once; hosts never do."
                )
            files = {
                wheel.name: {"size": wheel.stat().st_size, "sha256": sha256_of(wheel)}
                for wheel in sorted(building.glob("*.whl"))
            }
            (building / MANIFEST).write_text(json.dumps({"key": key(), "files": files}, indent=1))
            building.rename(where)
            log(f"wheelhouse ready: {len(files)} wheels, {mb(sum(f['size'] for f in files.values()))} "
                f"({time.monotonic() - started:.0f} s)")  # fmt: skip
        finally:
            shutil.rmtree(building, ignore_errors=True)
    built = load_wheelhouse(where)
    if built is None:
        raise RuntimeProblem(f"the wheelhouse {where} was built but does not read back")
    return built


def mb(size: int) -> str:
    return f"{size / 1e6:.0f} MB"


# --- the image (control plane) -----------------------------------------------------------------------
#
# The same packages, installed once on the control plane (`pip install --target` from the wheelhouse, so
# exactly the pins) and packed read-only in one squashfs file (`mksquashfs`, zstd). A host where Volt may
# use sudo receives that one file and loop-mounts it under its runtime's venv: nothing is unpacked or
# compiled on the host, which is what a bootstrap of one host spent its CPU on (pip: 23 of 31 s).


@dataclass(frozen=True)
class Image:
    path: Path
    size: int
    sha256: str


def image_path() -> Path:
    return build_dir() / "runtime-image" / f"{key()}.sqfs"


def image_unavailable() -> str:
    """Why this control plane will not install runtimes as images ("" when it will)."""
    if not settings.VOLT_RUNTIME_IMAGE:
        return "VOLT_RUNTIME_IMAGE is off"
    if shutil.which("mksquashfs") is None:
        return "this machine has no mksquashfs (Debian/Ubuntu: apt-get install squashfs-tools)"
    return ""


def record_path(image: Path) -> Path:
    return image.with_name(f"{image.name}.json")


def load_image(where: Path | None = None) -> Image | None:
    """The image at `where` if its record (`<name>.json`: size, sha256) is there and the size matches."""
    where = Path(where or image_path())
    try:
        record = json.loads(record_path(where).read_text())
        if where.stat().st_size != record["size"]:
            return None
        return Image(where, record["size"], record["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _build_step(command: list[str]) -> None:
    """One step of the image's build; RuntimeProblem (which sends hosts the wheels) however it fails."""
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    except (subprocess.SubprocessError, OSError) as exc:
        raise RuntimeProblem(f"could not build the runtime's image ({Path(command[0]).name}: {exc})") from exc
    if result.returncode != 0:
        raise RuntimeProblem(
            f"could not build the runtime's image ({Path(command[0]).name} failed): "
            f"{(result.stderr or result.stdout).strip()[-600:]}"
        )


def build_image(wheelhouse: Wheelhouse, log: Callable[[str], None] = lambda _: None) -> Image:
    """The runtime's image, built once from the wheelhouse and kept (one build for concurrent callers)."""
    where = image_path()
    with _one_build(where):
        built = load_image(where)
        if built is not None:
            return built
        staging = where.with_name(f"{where.name}.site-{os.getpid()}")
        packed = where.with_name(f"{where.name}.building-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        packed.unlink(missing_ok=True)
        try:
            started = time.monotonic()
            log(f"building the runtime's image from {len(wheelhouse.files)} wheels in {where}")
            # Every user on a host runs from the image (a cluster's own Unix user), and nothing can change its
            # modes there: world-readable whatever this worker's umask (`chmod -R a+rX`), owned by root.
            steps = [
                [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input",
                 "--no-index", "--no-warn-script-location", "--find-links", str(wheelhouse.path),
                 "--target", str(staging), *requirements()],
                ["chmod", "-R", "a+rX", str(staging)],
                ["mksquashfs", str(staging), str(packed), "-comp", "zstd", "-Xcompression-level", "9",
                 "-all-root", "-noappend", "-quiet", "-no-progress"],
            ]  # fmt: skip
            for command in steps:
                _build_step(command)
            record_path(where).unlink(missing_ok=True)  # no record of an earlier image may vouch for this one
            try:
                record = {"key": key(), "size": packed.stat().st_size, "sha256": sha256_of(packed)}
                packed.rename(where)
                written = record_path(where).with_name(f"{record_path(where).name}.{os.getpid()}")
                written.write_text(json.dumps(record))
                written.rename(record_path(where))
            except OSError as exc:
                raise RuntimeProblem(f"could not keep the runtime's image in {where.parent}: {exc}") from exc
            log(f"runtime image ready: {mb(record['size'])} ({time.monotonic() - started:.0f} s)")
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            packed.unlink(missing_ok=True)
    built = load_image(where)
    if built is None:
        raise RuntimeProblem(f"the runtime image {where} was built but does not read back")
    return built
