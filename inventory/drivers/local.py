"""The `local` driver: each host is a sandbox folder on this machine (the embedded default).

A sandbox looks like a small host: `spec.json` declares its GPUs and NICs, `bin/` holds a simulated
`nvidia-smi` and `ibstat` that print the real formats (see simulator.py), `home/` is the working
directory, and `faults/` holds files that inject failures:

    faults/unreachable          every driver call fails as if the host were down
    faults/nvidia_smi_garbage   nvidia-smi prints something that is not its real output
    faults/driver_not_loaded    nvidia-smi prints NVIDIA's "couldn't communicate with the NVIDIA driver"
                                and exits 9, as on a host whose kernel module is not loaded
    faults/gpu_lost             "3" or "1,5": those GPUs fell off the bus
    faults/ecc_uncorrectable    "0": those GPUs report uncorrectable ECC errors
    faults/hot                  "2": those GPUs run at 96 C
    faults/partitioned          the host cannot reach other hosts: a Ray worker started here keeps
                                running but never joins its head (commands get the head's address
                                rewritten to a closed port, as a firewall drop would leave it)
    faults/throttled            "20": the host runs at 20% of one CPU (a thermally throttled or
                                oversubscribed machine): every command, and every process it starts
                                (Ray nodes and their workers too), runs in a CPU cgroup with that
                                quota. Needs a writable cgroup (root); clear_fault removes the cgroup
                                once nothing runs in it.
    faults/link_degraded        "25": the host's links run at 25% of their rate     } emulated fabric only
    faults/link_flapping        its links go down and up every few seconds          } (inventory/
    faults/ib_fallback          its links drop to the Ethernet class's rate         }  fabric_emulation.py)
A host without nvidia-smi is a sandbox whose bin/ lacks it (fault `nvidia_smi_missing` at creation);
the same for ibstat (`ibstat_missing`). `sys/class/infiniband/` holds the NICs' sysfs files (what
discovery reads where ibstat is absent), laid out from the spec.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from inventory.drivers import faults as fault_table
from inventory.drivers.base import CommandResult, CommandTimeout, DriverError, HostDriver, HostUnreachable
from inventory.drivers.simulator import sysfs_tree

REPO_ROOT = Path(__file__).resolve().parents[2]
FAULTS = fault_table.NAMES  # what each does, takes and applies to: inventory/drivers/faults.py
LINK_FAULTS = ("link_degraded", "link_flapping", "ib_fallback")
_HEAD_ADDRESS = re.compile(r"--address=([0-9.]+):\d+")
_TOOLS = ("nvidia-smi", "ibstat")


class LocalDriver(HostDriver):
    """Runs commands in the sandbox with its own PATH, HOME and loopback address."""

    def __init__(
        self, sandbox: Path, address: str, default_timeout: float = 30.0, preload: Path | None = None
    ):
        self.sandbox = Path(sandbox)
        self.address = address
        self.default_timeout = default_timeout
        self.preload = preload  # emulated fabric: bindsrc.so, so connections leave from `address`

    def _check_up(self) -> None:
        if not self.sandbox.is_dir():
            raise HostUnreachable(f"local host {self.address}: sandbox {self.sandbox} does not exist.")
        if (self.sandbox / "faults" / "unreachable").exists():
            raise HostUnreachable(
                f"local host {self.address} is not answering (fault injected: unreachable)."
            )

    def environment(self) -> dict[str, str]:
        bin_dirs = [
            str(self.sandbox / "bin"),
            str(Path(sys.executable).parent),
            "/usr/local/bin",
            "/usr/bin",
            "/bin",
        ]
        env = {
            "PATH": os.pathsep.join(bin_dirs),
            "HOME": str(self.sandbox / "home"),
            "VOLT_HOST_ROOT": str(self.sandbox),
            "VOLT_HOST_ADDRESS": self.address,
            "PYTHONPATH": str(REPO_ROOT),
            "GLOO_SOCKET_IFNAME": "lo",
            "LANG": "C.UTF-8",
        }
        if self.preload is not None:
            env["LD_PRELOAD"] = str(self.preload)
        return env

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        self._check_up()
        if (self.sandbox / "faults" / "partitioned").exists():
            command = _HEAD_ADDRESS.sub(r"--address=\1:1", command)
        throttle = self.sandbox / "faults" / "throttled"
        if throttle.exists():
            procs = _cpu_cgroup(self.sandbox, _throttle_percent(throttle.read_text()))
            command = f"echo $$ > {shlex.quote(str(procs))} && {command}"
        return _run_bash(command, self.sandbox / "home", self.environment(), timeout or self.default_timeout,
                         self.address)  # fmt: skip

    def copy_file(self, local_path: Path, remote_path: str, timeout: float | None = None) -> None:
        self._check_up()
        target = self.resolve(remote_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local_path, target)

    def check_reachable(self, timeout: float | None = None) -> None:
        self._check_up()

    def resolve(self, remote_path: str) -> Path:
        """Map a host path into the sandbox: absolute paths are rooted at the sandbox, others at home/."""
        base = self.sandbox if remote_path.startswith("/") else self.sandbox / "home"
        target = (base / remote_path.lstrip("/")).resolve()
        if not target.is_relative_to(self.sandbox.resolve()):
            raise DriverError(f"{remote_path!r} points outside the host's sandbox.")
        return target


class ThisMachine(HostDriver):
    """Commands on this machine itself, outside every sandbox: machine-wide work for local hosts.

    Local hosts are folders of this machine and share its users, processes and files, so what belongs to
    the machine rather than to one host (a cluster's Unix user) is done here, whatever the state of any
    host: a sandbox faulted `unreachable` refuses its commands, and a retired host's may be gone.
    """

    address = "this machine"

    def __init__(self, default_timeout: float = 30.0):
        self.default_timeout = default_timeout

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
        return _run_bash(command, Path("/"), env, timeout or self.default_timeout, self.address)

    def copy_file(self, local_path: Path, remote_path: str, timeout: float | None = None) -> None:
        shutil.copyfile(local_path, remote_path)

    def check_reachable(self, timeout: float | None = None) -> None:
        return None


def _run_bash(command: str, cwd: Path, env: dict[str, str], limit: float, where: str) -> CommandResult:
    """`bash -c command` in its own session; past `limit` seconds its whole group is killed (CommandTimeout)."""
    proc = subprocess.Popen(
        ["bash", "-c", command], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise CommandTimeout(f"{command!r} on {where} ran past {limit:g} s and was stopped.") from None
    return CommandResult(proc.returncode, stdout, stderr)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()


def create_sandbox(sandbox: Path, spec: Mapping, faults: Mapping[str, str] | None = None) -> None:
    """Lay out (or refresh) a sandbox for `spec`; `faults` maps fault names to file contents."""
    for sub in ("bin", "home", "faults", "workspace"):
        (sandbox / sub).mkdir(parents=True, exist_ok=True)
    (sandbox / "spec.json").write_text(json.dumps(dict(spec), indent=2))
    faults = dict(faults or {})
    unknown = set(faults) - set(FAULTS)
    if unknown:
        raise ValueError(f"unknown fault(s) {sorted(unknown)}; known: {', '.join(FAULTS)}")
    for existing in (sandbox / "faults").iterdir():
        existing.unlink()
    for name, content in faults.items():
        if not fault_table.BY_NAME[name].at_creation_only:
            (sandbox / "faults" / name).write_text(content)
    shutil.rmtree(sandbox / "sys", ignore_errors=True)
    for relative, content in sysfs_tree(dict(spec)).items():
        (sandbox / relative).parent.mkdir(parents=True, exist_ok=True)
        (sandbox / relative).write_text(content)
    for tool in _TOOLS:
        path = sandbox / "bin" / tool
        path.unlink(missing_ok=True)
        if f"{tool.replace('-', '_')}_missing" in faults:
            continue
        path.write_text(_tool_script(tool))
        path.chmod(0o755)


def creation_faults(sandbox: Path) -> list[str]:
    """The faults the sandbox was created with that leave no file in faults/: a tool left out of bin/
    (`nvidia_smi_missing`, `ibstat_missing`)."""
    if not (sandbox / "bin").is_dir():
        return []
    return [f"{tool.replace('-', '_')}_missing" for tool in _TOOLS if not (sandbox / "bin" / tool).exists()]


def set_fault(sandbox: Path, name: str, content: str = "") -> None:
    """Inject a fault into a running sandbox (tests, demos)."""
    if name not in FAULTS or fault_table.BY_NAME[name].at_creation_only:
        raise ValueError(f"cannot inject {name!r} at run time")
    if name == "link_degraded":
        percent_value(name, content)
    (sandbox / "faults" / name).write_text(content)


def clear_fault(sandbox: Path, name: str) -> None:
    (sandbox / "faults" / name).unlink(missing_ok=True)
    if name == "throttled":
        _remove_cpu_cgroup(sandbox)


# --- the `throttled` fault: a CPU cgroup per sandbox ------------------------------------------------

_CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")
_CGROUP_V2 = Path("/sys/fs/cgroup")
_PERIOD_US = 100_000


def percent_value(fault: str, content: str) -> int:
    """The percentage a `throttled` (of one CPU) or `link_degraded` (of the link rate) fault holds."""
    text = content.strip() or {"throttled": "20", "link_degraded": "50"}[fault]
    try:
        percent = int(text)
    except ValueError:
        percent = None
    if percent is None or not 1 <= percent <= 100:
        what = "a CPU percentage" if fault == "throttled" else "a percentage of the link rate"
        raise DriverError(f"fault {fault} holds {text!r}; write {what} from 1 to 100")
    return percent


def _throttle_percent(content: str) -> int:
    return percent_value("throttled", content)


def _cgroup_dir(sandbox: Path) -> Path:
    name = "volt-throttle-" + hashlib.sha1(str(Path(sandbox).resolve()).encode()).hexdigest()[:12]
    if (_CGROUP_V2 / "cgroup.controllers").exists():
        return _CGROUP_V2 / name
    return _CGROUP_V1_CPU / name


def _cpu_cgroup(sandbox: Path, percent: int) -> Path:
    """The sandbox's CPU cgroup, capped at `percent` of one CPU; returns its cgroup.procs file."""
    group = _cgroup_dir(sandbox)
    quota = percent * _PERIOD_US // 100
    try:
        group.mkdir(exist_ok=True)
        if group.parent == _CGROUP_V2:
            (group / "cpu.max").write_text(f"{quota} {_PERIOD_US}")
        else:
            (group / "cpu.cfs_period_us").write_text(str(_PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
    except OSError as exc:
        raise DriverError(
            f"fault throttled needs a writable CPU cgroup ({group}: {exc.strerror or exc}); "
            "run as root, or with the cpu controller delegated to this user"
        ) from exc
    return group / "cgroup.procs"


def _remove_cpu_cgroup(sandbox: Path) -> None:
    try:
        _cgroup_dir(sandbox).rmdir()
    except OSError:  # absent, or processes still run in it (they keep their cap until they end)
        pass


def _tool_script(tool: str) -> str:
    return (
        "#!/bin/sh\n"
        f'PYTHONPATH="{REPO_ROOT}" exec "{sys.executable}" -m inventory.drivers.simulator {tool} "$@"\n'
    )
