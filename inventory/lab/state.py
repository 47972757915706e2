"""The lab's state file: what a lab is made of, written before each piece is made.

`<VOLT_LAB_DIR>/lab<N>/state.json` records the namespaces the lab creates (each named before it is made),
every process it starts (PID and start time, so a PID the kernel gave to another process since is never
signalled), each machine's power and cable, host key and PID 1. `lab down` and the next `lab up` read it
to find what to remove; whatever a crash left unrecorded is still found by name (namespaces called
`volt-lab<N>-…`) and by namespace (every process in them is the lab's). Commands on one lab take
`lock(lab)` so two never change it at once.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

STATE_NAME = "state.json"
LOCK_DIR = Path("/tmp")

STARTING = "starting"  # `lab up` is making it (or was killed while it did)
UP = "up"
STOPPING = "stopping"  # `lab down` is removing it (or was killed while it did)

POWER_ON = "on"
POWER_OFF = "off"


@dataclass(frozen=True)
class ProcessRef:
    """A process the lab started: its PID and its start time (clock ticks since boot), which tell it apart
    from a later process that got the same PID."""

    pid: int
    start: int

    @classmethod
    def of(cls, pid: int) -> ProcessRef | None:
        start = start_time(pid)
        return None if start is None else cls(pid, start)

    def alive(self) -> bool:
        return start_time(self.pid) == self.start


def start_time(pid: int) -> int | None:
    """The start time of process `pid` (field 22 of /proc/PID/stat), or None when there is none or it is a
    zombie (it ran: it is over)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def parent_pid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


@dataclass
class MachineState:
    """One machine's power, cable and processes."""

    power: str = POWER_OFF
    plugged: bool = True
    launcher: ProcessRef | None = None  # `unshare`, in the root PID namespace: PID 1's parent
    pid1: ProcessRef | None = None  # the machine's sshd, PID 1 of its PID namespace (host PID here)
    host_key: str = ""  # "ssh-ed25519 AAAA…"


@dataclass
class LabState:
    """Everything `lab down` needs to find: see the module docstring."""

    lab: int
    status: str = STARTING
    owner: ProcessRef | None = None  # the `lab up` that is making it
    scale: float = 1.0
    topology: dict = field(default_factory=dict)
    namespaces: list[str] = field(default_factory=list)
    machines: dict[str, MachineState] = field(default_factory=dict)
    gate: ProcessRef | None = None
    gate_port: int = 22
    login_user: str = "volt"
    login_uid: int = 0
    run_netns_was_mounted: bool = True
    # The gate's back routes: {"10.77.0.1:5432": "127.0.0.1:5432"}, what control machines reach.
    services: dict[str, str] = field(default_factory=dict)
    # The checkpoint store's S3 API as every machine reaches it ({"10.77.0.1:8333": "127.0.0.1:8333"}), and
    # the endpoint that makes for Volt's VOLT_STORE_NODE_ENDPOINT ("" without a store on this box's loopback).
    store_route: dict[str, str] = field(default_factory=dict)
    store_endpoint: str = ""

    def as_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> LabState:
        data = dict(data)
        data["owner"] = _ref(data.get("owner"))
        data["gate"] = _ref(data.get("gate"))
        data["machines"] = {
            name: MachineState(**(m | {"launcher": _ref(m.get("launcher")), "pid1": _ref(m.get("pid1"))}))
            for name, m in data.get("machines", {}).items()
        }
        return cls(**data)


def _ref(value: dict | None) -> ProcessRef | None:
    return None if not value else ProcessRef(int(value["pid"]), int(value["start"]))


def lab_dir(base: Path, lab: int) -> Path:
    return Path(base) / f"lab{lab}"


def read(directory: Path) -> LabState | None:
    """The state in `directory`, or None when there is none (or it is unreadable: a crash mid-write
    leaves the previous file, since `write` renames a whole file into place)."""
    try:
        return LabState.from_json(json.loads((Path(directory) / STATE_NAME).read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def write(directory: Path, state: LabState) -> None:
    """Replace the state file whole (write, fsync, rename): a reader never sees half a file."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    temporary = directory / f".{STATE_NAME}.{os.getpid()}"
    with open(temporary, "w") as handle:
        json.dump(state.as_json(), handle, indent=2)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, directory / STATE_NAME)


@contextmanager
def lock(lab: int) -> Iterator[None]:
    """Hold lab `lab`'s lock (a flock the kernel lets go of however the holder ends)."""
    path = LOCK_DIR / f"volt-lab{lab}.lock"
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
