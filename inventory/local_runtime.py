"""The Ray runtime of `local` hosts: DESIGN.md "Host runtime".

Each host runs Ray (its nodes, the probe, the team's job drivers) from a Python environment with
exactly the Ray, torch, numpy and boto3 that Volt pins (inventory/host_runtime.py: the pins, and the runtime SSH
hosts get over SSH). Local hosts share this machine and use one venv, the local runtime:

- built from a system interpreter of Volt's Python minor version in a folder every user can search
  (`/usr/bin/python3.11`), into `VOLT_LOCAL_RUNTIME` (default
  `/opt/volt/runtime-ray<ray>-torch<torch>-py<major.minor>`), readable and runnable by every user, so
  that a cluster's own Unix user can run Ray from it (Volt's own venv usually links into a folder
  closed to others, e.g. /root/.pyenv, and may sit in a `mktemp -d` checkout);
- holding `ray[default]`, `torch` and `numpy` at Volt's installed versions and nothing of Volt: code
  that runs on a cluster imports neither Django nor this project (numpy because torch looks for it at
  import: without it every job's log began with torch's "Failed to initialize NumPy" warning);
- built by `manage.py local_runtime` (the demo and scripts/test call it as root; a few minutes from
  PyPI's wheels in pip's cache, see docs/architecture.md "Security of a cluster").

Without it, local hosts run Ray from Volt's own environment (as Volt's user: jobs are not isolated,
the timeline says so). With it present but not matching Volt's pins, local provisioning is refused
with a message that says how to rebuild it. Volt's job submission client only talks HTTP to the
cluster, but Ray's versions must match exactly on both ends.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

from inventory import host_runtime
from inventory.drivers.base import DriverError
from inventory.host_runtime import PINNED, pins, python_version  # noqa: F401 - this module's face too

_cache: dict[tuple, RuntimeStatus] = {}


class RuntimeMismatch(DriverError):
    """The local runtime exists but does not match Volt's pins (or is unusable): local hosts refuse."""

    code = "local_runtime_mismatch"


@dataclass
class RuntimeStatus:
    path: Path
    exists: bool
    versions: dict[str, str | None] = field(default_factory=dict)
    python_version: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def ready(self) -> bool:
        return self.exists and not self.problems


def describe(status: RuntimeStatus) -> str:
    """What the runtime holds of Volt's pins, e.g. "ray 2.60.0, torch 2.13.0, numpy 2.4.6"."""
    return ", ".join(f"{name} {status.versions.get(name) or 'missing'}" for name in PINNED)


def default_path() -> Path:
    # Named by the runtime's key (Ray, torch, Python): a runtime built before numpy was pinned keeps its
    # name, so the check reports it ("numpy missing") and `local_runtime --rebuild` replaces it in place.
    # The same path as a provider's pre-installed runtime on an SSH host (inventory/host_runtime.py).
    return Path(f"{host_runtime.SYSTEM_DIR}/runtime-{host_runtime.key()}")


def path() -> Path:
    configured = getattr(settings, "VOLT_LOCAL_RUNTIME", "")
    return Path(configured) if configured else default_path()


def open_to_others(python: str | Path) -> bool:
    """Whether another Unix user can run this Python: every folder above it (and above the interpreter
    it links to) searchable by others, the interpreter executable by them."""
    link = Path(python).absolute()
    try:
        for candidate in (link, link.resolve()):
            for folder in candidate.parents:
                if not folder.stat().st_mode & 0o001:
                    return False
        return bool(link.resolve().stat().st_mode & 0o001)
    except OSError:
        return False


def check(where: Path | None = None) -> RuntimeStatus:
    """What the runtime at `where` (default: the configured one) holds, and what is wrong with it."""
    where = Path(where or path())
    python = where / "bin" / "python"
    if not python.exists():
        return RuntimeStatus(where, exists=False)
    try:
        stamp = (python.resolve().stat().st_mtime, (where / "lib").stat().st_mtime, _site_stamp(where))
    except OSError:
        stamp = None
    key = (str(where), stamp, tuple(sorted(pins().items())))
    if stamp is not None and key in _cache:
        return _cache[key]
    status = _inspect(where, python)
    if stamp is not None:
        _cache[key] = status
    return status


def _site_stamp(where: Path) -> float:
    newest = 0.0
    for site in (where / "lib").glob("python*/site-packages"):
        newest = max(newest, site.stat().st_mtime)
    return newest


def _inspect(where: Path, python: Path) -> RuntimeStatus:
    status = RuntimeStatus(where, exists=True)
    try:
        # -I: no PYTHONPATH, no user site: exactly what a Ray node started under `env -i` sees.
        result = subprocess.run(
            ["/bin/sh", "-c", host_runtime.report_command(str(python))],
            capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        report = json.loads(result.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        status.problems.append(f"{python} does not run ({exc})")
        return status
    status.versions, status.python_version = report["versions"], report["python"]
    status.problems.extend(host_runtime.judge(report))
    if not open_to_others(python):
        status.problems.append("other Unix users cannot run its python (a folder above it is closed)")
    return status


def mismatch_message(status: RuntimeStatus) -> str:
    return (
        f"The local hosts' Ray runtime {status.path} does not match Volt: {'; '.join(status.problems)}. "
        "Rebuild it with `python manage.py local_runtime --rebuild` (or point VOLT_LOCAL_RUNTIME at a "
        "matching one)."
    )


def python_for_local_hosts() -> str:
    """The Python local hosts run Ray, the probe and job drivers from: the runtime's when it is there,
    else Volt's own (`VOLT_LOCAL_RUNTIME` set to a missing folder is refused). Raises RuntimeMismatch."""
    status = check()
    if status.ready:
        return str(status.python)
    if status.exists:
        raise RuntimeMismatch(mismatch_message(status))
    if getattr(settings, "VOLT_LOCAL_RUNTIME", ""):
        raise RuntimeMismatch(
            f"VOLT_LOCAL_RUNTIME={status.path} does not exist: build it with `python manage.py local_runtime`."
        )
    return sys.executable


def uses_runtime() -> bool:
    """Whether local hosts run Ray from the local runtime (not from Volt's own environment)."""
    return check().ready


def base_interpreter() -> Path:
    """A system Python of Volt's minor version that every user can run (the runtime's base)."""
    configured = getattr(settings, "VOLT_LOCAL_RUNTIME_BASE_PYTHON", "")
    names = [configured] if configured else [
        f"/usr/bin/python{python_version()}", f"/usr/local/bin/python{python_version()}"
    ]  # fmt: skip
    for name in names:
        if Path(name).exists() and open_to_others(name):
            return Path(name)
    raise RuntimeMismatch(
        f"no Python {python_version()} that every user can run was found ({', '.join(names)}): install "
        f"one (Debian: apt-get install python{python_version()}-venv) or set VOLT_LOCAL_RUNTIME_BASE_PYTHON."
    )


def build(
    where: Path | None = None, *, rebuild: bool = False, log: Callable[[str], None] = print
) -> RuntimeStatus:
    """Create the runtime (a venv from `base_interpreter()`, then Volt's exact Ray, torch and numpy).
    Idempotent: a matching runtime is kept; a mismatching one is replaced only with `rebuild`."""
    where = Path(where or path())
    status = check(where)
    if status.ready:
        log(f"local runtime {where}: {describe(status)} (ready)")
        return status
    if status.exists and not rebuild:
        raise RuntimeMismatch(mismatch_message(status))
    base = base_interpreter()
    building = where.with_name(f"{where.name}.building-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    old_umask = os.umask(0o022)  # every user must read and run it
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        log(f"local runtime: venv from {base} in {building}")
        _run([str(base), "-m", "venv", str(building)])
        # torch by exact version: `torch==2.13.0` takes the CPU build (a bare `torch` could be a CUDA one).
        requirements = host_runtime.requirements()
        log(f"local runtime: pip install {' '.join(requirements)}")
        _run([str(building / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
              "--no-input", *requirements])  # fmt: skip
        if status.exists:
            shutil.rmtree(where)
        building.rename(where)
        # The venv records the folder it was made in; Ray's scripts take their python from the link.
        config = where / "pyvenv.cfg"
        config.write_text(config.read_text().replace(str(building), str(where)))
        for script in (where / "bin").iterdir():
            if script.is_file() and not script.is_symlink():
                text = script.read_bytes()
                if str(building).encode() in text:
                    script.write_bytes(text.replace(str(building).encode(), str(where).encode()))
    finally:
        os.umask(old_umask)
        shutil.rmtree(building, ignore_errors=True)
    _cache.clear()
    status = check(where)
    if not status.ready:
        raise RuntimeMismatch(mismatch_message(status))
    log(f"local runtime {where}: {describe(status)} (built)")
    return status


def _run(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        raise RuntimeMismatch(f"{' '.join(command[:4])} failed: {(result.stderr or result.stdout)[-800:]}")
