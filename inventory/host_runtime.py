"""Volt's runtime on a host, brought over SSH alone: DESIGN.md "Host runtime" (issue 25 item 2).

Every node of a cluster (head, workers) and Volt itself, which submits jobs and reads the cluster over
Ray's HTTP API, must run exactly the same Ray on the same Python minor version; torch and numpy are
pinned with it so that every node trains with the same code. This module holds those pins and brings
them to a host through its driver (no Django models here):

- **The pins**: Volt's own `ray`, `torch` and `numpy`, exactly as installed (`2.13.0+cpu` included), and
  its Python minor version. Their key, `ray<ray>-torch<torch>-py<x.y>`, names every copy of the runtime.
- **The wheelhouse**: built once on the control plane (`<VOLT_DATA_DIR>/wheelhouse/<key>/`, `pip download
  --only-binary=:all:` of the pins and everything they need, plus pip's own wheel) with a manifest of
  each wheel's size and sha256. Hosts need no internet and no package index.
- **On the host**: `/opt/volt/runtime-<key>` where Volt may use sudo (or logs in as root), readable and
  runnable by every user (a cluster's own Unix user runs Ray from it), else `~/.volt/runtime-<key>`. A
  provider may put one at either path beforehand: Volt then only verifies it. The wheels go to
  `~/.volt/wheelhouse/<key>/` (only those missing or whose sha256 differs are copied, each checked after
  the copy); the venv is made with `--without-pip` from the host's own Python of Volt's minor version and
  filled by pip run from its wheel (`python pip.whl/pip install --no-index`), so the host needs no
  python3-venv's ensurepip either. `.volt-runtime.json` in the venv says Volt installed it, and when.
- **The check** (`inspect`): the venv's python, run with `-I` (nothing of the login's environment), reports
  the versions it holds; anything else than the pins, another Python minor version, or code of Volt or
  Django in it is a problem, named. Provisioning runs it on every SSH node before each cluster.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

from django.conf import settings

from inventory.drivers.base import DriverError, HostDriver

PINNED = ("ray", "torch", "numpy")
# What the runtime must not hold: code on clusters imports neither Django nor Volt.
FORBIDDEN = ("django", "voltweb", "inventory", "clusters", "jobs")
MARKER = ".volt-runtime.json"
SYSTEM_DIR = "/opt/volt"  # where a runtime lives when Volt may use sudo (or logs in as root)
HOME_DIR = ".volt"  # under the login's home otherwise; the wheelhouse always lives there
MANIFEST = "MANIFEST.json"
# Prints what a runtime holds: its Python minor version, the pinned packages' versions, foreign modules.
REPORT_CODE = (
    "import importlib.metadata as m, importlib.util as u, json, sys\n"
    "pinned, forbidden = json.loads(sys.argv[1])\n"
    "def v(n):\n"
    "    try:\n"
    "        return m.version(n)\n"
    "    except m.PackageNotFoundError:\n"
    "        return None\n"
    "print(json.dumps({'python': '%d.%d' % sys.version_info[:2], 'versions': {n: v(n) for n in pinned},\n"
    "                  'foreign': [n for n in forbidden if u.find_spec(n) is not None]}))\n"
)
INSTALL_TIMEOUT_S = 1800


class RuntimeProblem(DriverError):
    """A host's runtime is missing, does not match Volt's pins, or could not be installed."""

    code = "runtime"


def pins() -> dict[str, str]:
    """Volt's own Ray, torch and numpy, exactly as installed: what every runtime must hold."""
    return {name: metadata.version(name) for name in PINNED}


def python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def key() -> str:
    """`ray2.60.0-torch2.13.0-py3.11`: names the runtime everywhere (the local runtime's folder too)."""
    versions = pins()
    return f"ray{versions['ray']}-torch{versions['torch'].split('+')[0]}-py{python_version()}"


def requirements() -> list[str]:
    versions = pins()
    # torch by exact version without its local label: `torch==2.13.0` takes the CPU build from the index
    # (a bare `torch` could be a CUDA one); the wheel's label is checked afterwards, with the others.
    return [
        f"ray[default]=={versions['ray']}",
        f"torch=={versions['torch'].split('+')[0]}",
        f"numpy=={versions['numpy']}",
    ]


def judge(report: dict) -> list[str]:
    """What is wrong with a runtime, from REPORT_CODE's output: each problem in words."""
    problems = []
    versions = report.get("versions") or {}
    for name, version in pins().items():
        if versions.get(name) != version:
            problems.append(f"{name} {versions.get(name) or 'missing'}, Volt pins {version}")
    if report.get("python") != python_version():
        problems.append(f"Python {report.get('python') or 'unknown'}, Volt runs {python_version()}")
    if report.get("foreign"):
        problems.append(f"it holds {', '.join(report['foreign'])} (code on clusters imports no Volt code)")
    return problems


def report_command(python: str) -> str:
    """The shell command that runs REPORT_CODE with `python` (-I: no PYTHONPATH, no user site)."""
    return f"{shlex.quote(python)} -I -c {shlex.quote(REPORT_CODE)} {shlex.quote(json.dumps([PINNED, FORBIDDEN]))}"


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


def wheelhouse_path() -> Path:
    return Path(settings.VOLT_DATA_DIR) / "wheelhouse" / key()


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


def build_wheelhouse(log: Callable[[str], None] = lambda _: None) -> Wheelhouse:
    """The wheelhouse of Volt's pins, built once (`pip download` from Volt's configured index) and kept.

    Concurrent callers (workers bootstrapping several hosts) wait for one build: a lock file beside it.
    """
    where = wheelhouse_path()
    where.parent.mkdir(parents=True, exist_ok=True)
    with open(where.parent / f"{where.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
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
            log(f"wheelhouse ready: {len(files)} wheels, {_mb(sum(f['size'] for f in files.values()))} "
                f"({time.monotonic() - started:.0f} s)")  # fmt: skip
        finally:
            shutil.rmtree(building, ignore_errors=True)
    built = load_wheelhouse(where)
    if built is None:
        raise RuntimeProblem(f"the wheelhouse {where} was built but does not read back")
    return built


def _mb(size: int) -> str:
    return f"{size / 1e6:.0f} MB"


# --- on the host -------------------------------------------------------------------------------------


@dataclass
class HostRuntime:
    """What a host holds of Volt's runtime: the record onboarding and provisioning keep (`Host.runtime`)."""

    key: str
    path: str = ""  # absolute, on the host
    python: str = ""  # path/bin/python
    exists: bool = False
    versions: dict[str, str | None] = field(default_factory=dict)
    python_version: str = ""
    problems: list[str] = field(default_factory=list)
    installed_by: str = ""  # "volt" (its marker is there) or "provider" (found, verified)
    installed_now: bool = False  # this call installed it (else it was found ready and verified)
    wheels_copied: int = 0  # of the wheelhouse, by this call (the others were on the host already)
    wheels: int = 0

    @property
    def ready(self) -> bool:
        return self.exists and not self.problems and self.key == key()

    def as_json(self) -> dict:
        return asdict(self) | {"ready": self.ready}


def home_of(driver: HostDriver) -> str:
    result = driver.run('printf "%s" "$HOME"', timeout=30)
    home = result.stdout.strip().splitlines()[-1] if result.ok and result.stdout.strip() else ""
    if not home.startswith("/"):
        raise RuntimeProblem(
            f"{driver.address}: could not read the login's home folder ({result.stderr[:200]})"
        )
    return home


def candidate_paths(home: str) -> list[str]:
    """Where a runtime of Volt's pins may be on a host, in the order Volt looks."""
    return [f"{SYSTEM_DIR}/runtime-{key()}", f"{home}/{HOME_DIR}/runtime-{key()}"]


def inspect(driver: HostDriver, path: str) -> HostRuntime:
    """What the runtime at `path` on the host holds, and what is wrong with it (one command)."""
    runtime = HostRuntime(key=key(), path=path, python=f"{path}/bin/python")
    python = shlex.quote(runtime.python)
    command = (
        f"if [ -x {python} ]; then echo @@exists; cat {shlex.quote(f'{path}/{MARKER}')} 2>/dev/null "
        f"&& echo; echo @@report; {report_command(runtime.python)}; fi"
    )
    result = driver.run(command, timeout=120)
    if "@@exists" not in result.stdout:
        return runtime
    runtime.exists = True
    marker, _, report_text = result.stdout.split("@@exists", 1)[1].partition("@@report")
    runtime.installed_by = "volt" if marker.strip().startswith("{") else "provider"
    try:
        report = json.loads(report_text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        runtime.problems.append(f"its python does not run: {(result.stderr or report_text).strip()[-300:]}")
        return runtime
    runtime.versions, runtime.python_version = report.get("versions") or {}, report.get("python", "")
    runtime.problems = judge(report)
    return runtime


def find(driver: HostDriver, home: str | None = None) -> HostRuntime:
    """The first runtime of Volt's key on the host that is ready; else the first that exists (with its
    problems); else a record with exists=False."""
    home = home or home_of(driver)
    found = [inspect(driver, path) for path in candidate_paths(home)]
    for runtime in found:
        if runtime.ready:
            return runtime
    return next((runtime for runtime in found if runtime.exists), found[-1])


def base_python(system: dict) -> str:
    """The host's Python of Volt's minor version, from what onboarding recorded (`Host.system`)."""
    wanted = python_version()
    for entry in system.get("pythons") or []:
        version = str(entry.get("version", ""))
        if version == wanted or version.startswith(f"{wanted}."):
            return entry["path"]
    found = ", ".join(f"{e.get('path')} ({e.get('version')})" for e in system.get("pythons") or []) or "none"
    raise RuntimeProblem(
        f"the host has no Python {wanted} (found: {found}); Ray needs the same Python minor version on every "
        f"node and on Volt's side. Install python{wanted} on the host (Debian/Ubuntu: apt-get install "
        f"python{wanted}), then install Volt's runtime again from the host page."
    )


def target_path(system: dict, home: str) -> str:
    """`/opt/volt/runtime-<key>` where Volt may use sudo (every user can run it), else under home."""
    return candidate_paths(home)[0 if system.get("privilege") in ("root", "sudo") else 1]


def copy_wheelhouse(
    driver: HostDriver, wheelhouse: Wheelhouse, home: str, progress: Callable[[str], None]
) -> tuple[str, int]:
    """Put the wheelhouse on the host (only wheels missing or with another sha256), each copy checked.
    Returns the remote folder and the number of wheels copied."""
    remote = f"{home}/{HOME_DIR}/wheelhouse/{key()}"
    listing = driver.run(
        f"mkdir -p {shlex.quote(remote)} && cd {shlex.quote(remote)} && (sha256sum -- *.whl 2>/dev/null || true)",
        timeout=300,
    )
    if not listing.ok:
        raise RuntimeProblem(f"could not make {remote} on the host: {listing.stderr.strip()[:300]}")
    present = {}
    for line in listing.stdout.splitlines():
        digest, _, name = line.strip().partition("  ")
        present[name.lstrip("*")] = digest
    missing = [name for name, entry in wheelhouse.files.items() if present.get(name) != entry["sha256"]]
    total = sum(wheelhouse.files[name]["size"] for name in missing)
    sent = 0
    for number, name in enumerate(missing, 1):
        progress(f"copying wheels: {number}/{len(missing)} ({_mb(sent)} of {_mb(total)})")
        size = wheelhouse.files[name]["size"]
        driver.copy_file(wheelhouse.path / name, f"{remote}/{name}", timeout=max(120.0, size / 5e6))
        sent += size
    if missing:
        names = " ".join(shlex.quote(name) for name in missing)
        check = driver.run(f"cd {shlex.quote(remote)} && sha256sum -- {names}", timeout=600)
        copied = {}
        for line in check.stdout.splitlines():
            digest, _, name = line.strip().partition("  ")
            copied[name.lstrip("*")] = digest
        bad = [name for name in missing if copied.get(name) != wheelhouse.files[name]["sha256"]]
        if bad:
            raise RuntimeProblem(f"wheels arrived damaged on the host (sha256 differs): {', '.join(bad[:3])}")
    return remote, len(missing)


def install(
    driver: HostDriver,
    system: dict,
    progress: Callable[[str], None] = lambda _: None,
    wheelhouse: Wheelhouse | None = None,
) -> HostRuntime:
    """Bring Volt's runtime to the host, or verify the one there: idempotent. Raises RuntimeProblem."""
    home = home_of(driver)
    progress("looking for a runtime of Volt's pins")
    found = find(driver, home)
    if found.ready:
        return found
    python = base_python(system)
    target = target_path(system, home)
    wheelhouse = wheelhouse or build_wheelhouse(progress)
    remote, copied = copy_wheelhouse(driver, wheelhouse, home, progress)
    sudo = "sudo -n " if system.get("privilege") == "sudo" else ""
    parent = shlex.quote(str(Path(target).parent))
    quoted = shlex.quote(target)
    steps = [f"rm -rf {quoted}"]
    if target.startswith(SYSTEM_DIR + "/"):
        steps.insert(0, f'{sudo}install -d -m 0755 -o "$(id -u)" -g "$(id -g)" {parent}')
    else:
        steps.insert(0, f"mkdir -p {parent}")
    progress(f"installing {', '.join(requirements())} from {len(wheelhouse.files)} wheels "
             f"({copied} copied) into {target}")  # fmt: skip
    pip = shlex.quote(f"{remote}/{wheelhouse.pip_wheel}/pip")
    wanted = " ".join(shlex.quote(r) for r in requirements())
    steps += [
        f"{shlex.quote(python)} -m venv --without-pip {quoted}",
        f"umask 022 && {quoted}/bin/python {pip} install --quiet --no-index --disable-pip-version-check "
        f"--no-input --no-warn-script-location --find-links {shlex.quote(remote)} {wanted}",
        f"chmod -R a+rX {quoted}",
    ]
    result = driver.run(" && ".join(steps), timeout=INSTALL_TIMEOUT_S)
    if not result.ok:
        raise RuntimeProblem(
            f"installing the runtime in {target} failed: {(result.stderr or result.stdout).strip()[-600:]}"
        )
    marker = json.dumps({"key": key(), "pins": pins(), "installed_at": time.time(), "by": "volt"})
    driver.run(f"printf '%s\\n' {shlex.quote(marker)} > {shlex.quote(f'{target}/{MARKER}')}", timeout=30)
    progress("verifying the runtime")
    runtime = inspect(driver, target)
    if not runtime.ready:
        raise RuntimeProblem(
            f"the runtime installed in {target} does not match: {'; '.join(runtime.problems)}"
        )
    runtime.installed_now, runtime.wheels_copied, runtime.wheels = True, copied, len(wheelhouse.files)
    return runtime


def mismatch_message(host_name: str, runtime: HostRuntime | dict) -> str:
    """What Volt says when a host's runtime is not what a cluster needs, with what to do."""
    record = runtime if isinstance(runtime, dict) else runtime.as_json()
    if not record.get("exists"):
        state = f"has no runtime of Volt's pins ({key()})"
    else:
        state = f"runtime {record.get('path')} does not match Volt: {'; '.join(record.get('problems') or [])}"
    return (
        f"{host_name} {state}. Install it again from the host page (Install Volt's runtime) or with "
        "POST /api/v1/hosts/<id>/runtime/; a provider who installs it by hand puts exactly "
        f"{', '.join(requirements())} on Python {python_version()} at {SYSTEM_DIR}/runtime-{key()}."
    )
