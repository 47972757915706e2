"""Volt's runtime on a host, brought over SSH alone: DESIGN.md "Host runtime" (issue 25 item 2).

Every node of a cluster (head, workers) and Volt itself, which submits jobs and reads the cluster over
Ray's HTTP API, must run exactly the same Ray on the same Python minor version; torch and numpy are
pinned with it so that every node trains with the same code. The pins, the wheelhouse and the image are
built on the control plane (inventory/runtime_build.py, whose public names this module passes on); this
module brings them to a host through its driver (no Django models here):

- **On the host**: `/opt/volt/runtime-<key>` where Volt may use sudo (or logs in as root), readable and
  runnable by every user (a cluster's own Unix user runs Ray from it), else `~/.volt/runtime-<key>`. A
  provider may put one at either path beforehand: Volt then only verifies it.
- **From the image** (the system folder, `VOLT_RUNTIME_IMAGE` on, `mksquashfs` on the control plane): the
  image goes to `~/.volt/images/<key>.sqfs` (unless there with its sha256; checked after the copy), the
  venv is made with `--without-pip` from the host's own Python of Volt's minor version, and the image is
  loop-mounted read-only at `<runtime>/image`; a `.pth` file puts it on the venv's path and the image's
  console scripts are written into the venv's bin. `.volt-image` records the image's path: the check
  mounts it again after a reboot. A host that cannot mount it gets the wheels instead.
- **From the wheels** (every other host): the wheels go to `~/.volt/wheelhouse/<key>/` (only those missing
  or whose sha256 differs are copied, each checked after the copy); the venv is filled by pip run from its
  wheel (`python pip.whl/pip install --no-index`), so the host needs no python3-venv's ensurepip either.
  `.volt-runtime.json` in the venv says Volt installed it, how, and when.
- **The check** (`inspect`): the venv's python, run with `-I` (nothing of the login's environment), reports
  the versions it holds; anything else than the pins, another Python minor version, or code of Volt or
  Django in it is a problem, named. Provisioning runs it on every SSH node before each cluster.
"""

from __future__ import annotations

import json
import logging
import shlex
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from inventory.drivers.base import DriverError, HostDriver, HostUnreachable
from inventory.runtime_build import INSTALL_TIMEOUT_S as INSTALL_TIMEOUT_S
from inventory.runtime_build import PINNED as PINNED
from inventory.runtime_build import Image, Wheelhouse, build_image, image_unavailable, mb
from inventory.runtime_build import RuntimeProblem as RuntimeProblem
from inventory.runtime_build import build_wheelhouse as build_wheelhouse
from inventory.runtime_build import key as key
from inventory.runtime_build import load_wheelhouse as load_wheelhouse
from inventory.runtime_build import pins as pins
from inventory.runtime_build import python_version as python_version
from inventory.runtime_build import requirements as requirements

logger = logging.getLogger(__name__)

# What the runtime must not hold: code on clusters imports neither Django nor Volt.
FORBIDDEN = ("django", "voltweb", "inventory", "clusters", "jobs")
MARKER = ".volt-runtime.json"
SYSTEM_DIR = "/opt/volt"  # where a runtime lives when Volt may use sudo (or logs in as root)
HOME_DIR = ".volt"  # under the login's home otherwise; the wheelhouse always lives there
IMAGE_MOUNT = "image"  # where a runtime installed from the image mounts it, inside the runtime's folder
IMAGE_RECORD = ".volt-image"  # in the runtime's folder: the image file's path on the host
MOUNT_OPTIONS = "-t squashfs -o ro,nodev,nosuid,loop"
DIGEST_CODE = (
    "import hashlib, sys\n"
    "with open(sys.argv[1], 'rb') as f:\n"
    "    print(hashlib.file_digest(f, 'sha256').hexdigest())\n"
)
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
    # How Volt installed it: "image" (one squashfs file, mounted) or "wheels" (pip); by this call when
    # `installed_now`, else as its marker says ("" when the provider installed it).
    method: str = ""
    image_copied: int = 0  # bytes of the image this call copied (0: it was on the host already)

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
    # An image-backed runtime whose mount went with a reboot (or a lab machine's power-off) is mounted again.
    image, mounted = shlex.quote(f"{path}/{IMAGE_RECORD}"), shlex.quote(f"{path}/{IMAGE_MOUNT}")
    command = (
        f"if [ -f {image} ] && ! mountpoint -q {mounted}; then "
        f'if [ "$(id -u)" = 0 ]; then S=; else S="sudo -n"; fi; '
        # Two checks at once (two clusters' bring-ups) must not mount it twice: one at a time, then again.
        f"(flock 9; mountpoint -q {mounted} || "
        f'$S mount {MOUNT_OPTIONS} "$(cat {image})" {mounted} 2>&1 | sed "s/^/@@unmounted /") 9<{image}; fi; '
        f"if [ -x {python} ]; then echo @@exists; cat {shlex.quote(f'{path}/{MARKER}')} 2>/dev/null "
        f"&& echo; echo @@report; {report_command(runtime.python)}; fi"
    )
    result = driver.run(command, timeout=120)
    if "@@exists" not in result.stdout:
        return runtime
    runtime.exists = True
    unmounted = [
        line[len("@@unmounted ") :] for line in result.stdout.splitlines() if line.startswith("@@unm")
    ]
    if unmounted:
        runtime.problems.append(f"its image could not be mounted again: {' '.join(unmounted)[:300]}")
    marker, _, report_text = result.stdout.split("@@exists", 1)[1].partition("@@report")
    runtime.installed_by = "volt" if marker.strip().startswith("{") else "provider"
    if runtime.installed_by == "volt":
        try:
            runtime.method = str(json.loads(marker.strip().splitlines()[0]).get("how") or "")
        except (ValueError, AttributeError):
            runtime.method = ""
    try:
        report = json.loads(report_text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        runtime.problems.append(f"its python does not run: {(result.stderr or report_text).strip()[-300:]}")
        return runtime
    runtime.versions, runtime.python_version = report.get("versions") or {}, report.get("python", "")
    runtime.problems += judge(report)
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
        progress(f"copying wheels: {number}/{len(missing)} ({mb(sent)} of {mb(total)})")
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
    """Bring Volt's runtime to the host, or verify the one there: idempotent. Raises RuntimeProblem.

    Where the runtime goes to the system folder (Volt may use sudo, or is root) and this control plane
    can build the image, the host gets the image, mounted; a host that cannot mount it (no loop device,
    no squashfs in its kernel) and every other host get the wheels, installed by pip on the host."""
    home = home_of(driver)
    progress("looking for a runtime of Volt's pins")
    found = find(driver, home)
    if found.ready:
        return found
    python = base_python(system)
    target = target_path(system, home)
    wheelhouse = wheelhouse or build_wheelhouse(progress)
    sudo = "sudo -n " if system.get("privilege") == "sudo" else ""
    if target.startswith(SYSTEM_DIR + "/") and not image_unavailable():
        try:
            image = build_image(wheelhouse, progress)
        except RuntimeProblem as exc:  # the control plane's problem: the host still gets its runtime
            logger.warning("the runtime image could not be built, hosts get the wheels: %s", exc)
            progress(f"the runtime image could not be built ({exc}): installing from the wheelhouse")
            image = None
        runtime = _install_image(driver, home, python, target, image, sudo, progress) if image else None
        if runtime is not None:
            remove_earlier(driver, home, target, sudo, progress)
            return runtime
    runtime = _install_wheels(driver, home, python, target, wheelhouse, sudo, progress)
    remove_earlier(driver, home, target, sudo, progress)
    return runtime


def remove_earlier(
    driver: HostDriver, home: str, target: str, sudo: str, progress: Callable[[str], None]
) -> list[str]:
    """Once the runtime of Volt's current pins is in place: earlier runtimes Volt installed on the host (its
    marker in them) go, their image unmounted first, and so do earlier images and wheelhouses. A runtime
    whose image is still in use (umount refuses) stays, named, for the next install. Never fails the
    install: returns what it could not remove."""
    here = key()
    home_dir = f"{home}/{HOME_DIR}"
    script = "\n".join(
        [
            f"for d in {SYSTEM_DIR}/runtime-* {shlex.quote(home_dir)}/runtime-*; do",
            f'  [ -d "$d" ] && [ "$d" != {shlex.quote(target)} ] && [ -f "$d/{MARKER}" ] || continue',
            f'  if [ -d "$d" ] && [ "${{d#{SYSTEM_DIR}/}}" != "$d" ]; then S={shlex.quote(sudo)}; else S=; fi',
            f'  while mountpoint -q "$d/{IMAGE_MOUNT}"; do $S umount "$d/{IMAGE_MOUNT}" || break; done',
            f'  if mountpoint -q "$d/{IMAGE_MOUNT}"; then echo "@@kept $d"; continue; fi',
            '  $S rm -rf "$d" && echo "@@removed $d" || echo "@@kept $d"',
            "done",
            f"for f in {shlex.quote(home_dir)}/images/*.sqfs {shlex.quote(home_dir)}/images/*.part; do",
            f'  [ -e "$f" ] && [ "$(basename "$f")" != {shlex.quote(here + ".sqfs")} ] && rm -f "$f"',
            "done",
            f"for w in {shlex.quote(home_dir)}/wheelhouse/*; do",
            f'  [ -d "$w" ] && [ "$(basename "$w")" != {shlex.quote(here)} ] && rm -rf "$w"',
            "done",
            "true",
        ]
    )
    try:
        result = driver.run(script, timeout=300)
    except DriverError as exc:
        progress(f"earlier runtimes were left on the host: {str(exc)[:200]}")
        return []
    kept = [line.split(" ", 1)[1] for line in result.stdout.splitlines() if line.startswith("@@kept ")]
    removed = [line.split(" ", 1)[1] for line in result.stdout.splitlines() if line.startswith("@@removed ")]
    if removed:
        progress(f"removed earlier runtimes: {', '.join(removed)}")
    if kept:
        progress(f"kept earlier runtimes still in use: {', '.join(kept)}")
    return kept


def _prepare(target: str, sudo: str) -> list[str]:
    """The shell steps that leave an empty folder at `target` (an earlier runtime's image unmounted)."""
    parent, quoted = shlex.quote(str(Path(target).parent)), shlex.quote(target)
    mounted = shlex.quote(f"{target}/{IMAGE_MOUNT}")
    make = (
        f'{sudo}install -d -m 0755 -o "$(id -u)" -g "$(id -g)" {parent}'
        if target.startswith(SYSTEM_DIR + "/")
        else f"mkdir -p {parent}"
    )
    # Every mount of it (a check may have stacked one on another), each unmount checked.
    unmount = f"while mountpoint -q {mounted}; do {sudo}umount {mounted} || exit 1; done"
    return [make, unmount, f"rm -rf {quoted}"]


def _run_steps(driver: HostDriver, steps: list[str], what: str, timeout: float) -> None:
    """Run shell `steps` on the host as one `&&` chain; RuntimeProblem naming `what` and its output if
    one fails."""
    result = driver.run(" && ".join(steps), timeout=timeout)
    if not result.ok:
        raise RuntimeProblem(f"{what} failed: {(result.stderr or result.stdout).strip()[-600:]}")


def _verified(driver: HostDriver, target: str) -> HostRuntime:
    runtime = inspect(driver, target)
    if not runtime.ready:
        raise RuntimeProblem(
            f"the runtime installed in {target} does not match: {'; '.join(runtime.problems)}"
        )
    runtime.installed_now = True
    return runtime


def _mark(driver: HostDriver, target: str, how: str) -> None:
    marker = json.dumps({"key": key(), "pins": pins(), "installed_at": time.time(), "by": "volt", "how": how})
    driver.run(f"printf '%s\\n' {shlex.quote(marker)} > {shlex.quote(f'{target}/{MARKER}')}", timeout=30)


def _install_wheels(
    driver: HostDriver,
    home: str,
    python: str,
    target: str,
    wheelhouse: Wheelhouse,
    sudo: str,
    progress: Callable[[str], None],
) -> HostRuntime:
    remote, copied = copy_wheelhouse(driver, wheelhouse, home, progress)
    quoted = shlex.quote(target)
    progress(f"installing {', '.join(requirements())} from {len(wheelhouse.files)} wheels "
             f"({copied} copied) into {target}")  # fmt: skip
    pip = shlex.quote(f"{remote}/{wheelhouse.pip_wheel}/pip")
    wanted = " ".join(shlex.quote(r) for r in requirements())
    steps = _prepare(target, sudo) + [
        f"{shlex.quote(python)} -m venv --without-pip {quoted}",
        f"umask 022 && {quoted}/bin/python {pip} install --quiet --no-index --disable-pip-version-check "
        f"--no-input --no-warn-script-location --find-links {shlex.quote(remote)} {wanted}",
        f"chmod -R a+rX {quoted}",
    ]
    _run_steps(driver, steps, f"installing the runtime in {target}", INSTALL_TIMEOUT_S)
    _mark(driver, target, "wheels")
    progress("verifying the runtime")
    runtime = _verified(driver, target)
    runtime.method, runtime.wheels_copied, runtime.wheels = "wheels", copied, len(wheelhouse.files)
    return runtime


def copy_image(
    driver: HostDriver, image: Image, home: str, python: str, progress: Callable[[str], None]
) -> tuple[str, int]:
    """Put the image on the host unless it is there with its sha256; the copy is checked before it takes
    the image's name. Returns the remote path and the bytes copied. The host's own `python` hashes it
    (hashlib: OpenSSL's SHA-256, several times coreutils' sha256sum where the CPU has SHA extensions)."""
    remote = f"{home}/{HOME_DIR}/images/{image.path.name}"
    quoted, part = shlex.quote(remote), shlex.quote(f"{remote}.part")
    digest = f"{shlex.quote(python)} -I -c {shlex.quote(DIGEST_CODE)}"
    there = driver.run(
        f"mkdir -p {shlex.quote(str(Path(remote).parent))} && ({digest} {quoted} 2>/dev/null || true)",
        timeout=300,
    )
    if not there.ok:
        raise RuntimeProblem(
            f"could not make {Path(remote).parent} on the host: {there.stderr.strip()[:300]}"
        )
    if there.stdout.split()[:1] == [image.sha256]:
        return remote, 0
    progress(f"copying the runtime image ({mb(image.size)})")
    driver.copy_file(image.path, f"{remote}.part", timeout=max(120.0, image.size / 5e6))
    check = driver.run(
        f'd=$({digest} {part}); if [ "$d" = {image.sha256} ]; then mv -f {part} {quoted}; '
        f'echo @@good; else rm -f {part}; echo "@@bad $d"; fi',
        timeout=300,
    )
    if "@@good" not in check.stdout:
        raise RuntimeProblem(
            f"the runtime image arrived damaged on the host (sha256 differs): {check.stdout[-200:]}"
        )
    return remote, image.size


def _install_image(
    driver: HostDriver,
    home: str,
    python: str,
    target: str,
    image: Image,
    sudo: str,
    progress: Callable[[str], None],
) -> HostRuntime | None:
    """Install from the image; None where the host cannot take it (the caller falls back to wheels): the copy
    failed or arrived damaged (what is left of it is removed), or the host cannot mount it. A host that
    stopped answering is no reason to try the wheels: that raises."""
    try:
        remote, copied = copy_image(driver, image, home, python, progress)
    except HostUnreachable:
        raise
    except DriverError as exc:
        progress(
            f"the runtime image could not be copied ({str(exc)[:200]}): installing from the wheelhouse instead"
        )
        part = shlex.quote(f"{home}/{HOME_DIR}/images/{image.path.name}.part")
        driver.run(f"rm -f {part}", timeout=30)
        return None
    quoted, mounted = shlex.quote(target), shlex.quote(f"{target}/{IMAGE_MOUNT}")
    progress(f"mounting the runtime image at {target}/{IMAGE_MOUNT}")
    steps = _prepare(target, sudo) + [
        "umask 022",
        f"{shlex.quote(python)} -m venv --without-pip {quoted}",
        f"mkdir {mounted}",
        f"chmod -R a+rX {quoted}",
    ]
    _run_steps(driver, steps, f"preparing the runtime in {target}", 300)
    mount = driver.run(f"{sudo}mount {MOUNT_OPTIONS} {shlex.quote(remote)} {mounted}", timeout=120)
    if not mount.ok:
        progress(f"the host cannot mount the image ({(mount.stderr or mount.stdout).strip()[:200]}): "
                 "installing from the wheelhouse instead")  # fmt: skip
        return None
    # The venv finds the image's packages through a .pth file; the image's console scripts (`ray`, …) are
    # written into the venv's bin with its python in their first line.
    shebang = shlex.quote(f"#!{target}/bin/python")
    steps = [
        "umask 022",
        f"printf '%s\\n' {mounted} > \"$(echo {quoted}/lib/python*/site-packages)/volt-runtime-image.pth\"",
        f'(for f in {mounted}/bin/*; do n=$(basename "$f"); [ -e {quoted}/bin/"$n" ] && continue; '
        f'[ "$(head -c 2 "$f")" = "#!" ] || continue; {{ echo {shebang}; tail -n +2 "$f"; }} > {quoted}/bin/"$n" '
        f'&& chmod 0755 {quoted}/bin/"$n"; done; true)',
        f"printf '%s' {shlex.quote(remote)} > {shlex.quote(f'{target}/{IMAGE_RECORD}')}",
    ]
    _run_steps(driver, steps, f"linking the runtime image in {target}", 120)
    _mark(driver, target, "image")
    progress("verifying the runtime")
    runtime = _verified(driver, target)
    runtime.method, runtime.image_copied = "image", copied
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
