"""Emulated fabric for `local` hosts: loopback traffic between two hosts shaped to their declared level.

DESIGN.md "Emulated fabric". Every local host has its own 127.x address. Where Volt may configure the
network (root or CAP_NET_ADMIN, `tc` present, a C compiler for the source-address shim), each ordered
pair of this install's hosts gets an HTB class on `lo` whose rate is the declared bandwidth of the
finest level the two share (block, fabric, site, region, global: the placement model's figures),
times VOLT_LOCAL_FABRIC_SCALE, times the hosts' link faults; u32 filters on (source, destination)
address send the pair's packets there. Nothing else is classified: traffic to or from 127.0.0.1
(PostgreSQL, Redis, the web server) and other installs' traffic pass unshaped.

Source addresses: a socket that connects to 127.0.0.N unbound leaves from 127.0.0.1, so every process
of a local host runs with `bindsrc.so` preloaded (inventory/drivers/bindsrc.c), which binds such
sockets to the host's own address first, as a real host's connections leave from its own address; it also
shows `lo`'s 127.0.0.1 as the host's address to getifaddrs(), so a program that listens on "the address of
interface lo" (gloo and NCCL with *_SOCKET_IFNAME=lo, as Volt sets for local hosts) listens on the host's own.

Several installs (a demo, test runs, other checkouts) share one machine and one `lo`. They share one
root HTB qdisc (`1:`, unclassified traffic goes straight through); each install claims a *slot*
(1..63) under a machine-wide lock: its classes are 1:(slot<<10) (parent) and 1:(slot<<10 | k) (pairs),
its filters sit at their own priority (100 + slot). Removing an install deletes exactly those; the
root qdisc goes with the last install. Filters are tried by priority, so two installs that shape the
same address pair would let the lower slot's class take every packet: a fault the other one injects
would never act. `apply` therefore clears the slots of dead installs that shape any of its addresses, and
refuses, naming the other install, when a live one does. An install is live while one of its processes
runs: each process that shapes holds a shared flock on `<VOLT_DATA_DIR>/fabric.live` (the kernel lets go
when it ends, however it ends); a folder left behind (pytest keeps its last runs' temporary folders, a
demo killed with SIGKILL) no longer keeps its links alive. The slot is recorded in `<VOLT_DATA_DIR>/fabric.json`, with
every class, so the link-flapping process can find a host's classes without Django.

Pure helpers (rates) come first; `apply`, `remove` and `flap` touch the machine.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

DEVICE = "lo"
LEVELS = ("block", "fabric", "site", "region", "global")
WAN_SAME_REGION_GBPS = 1.25  # the placement model's figures (clusters/placement/bandwidth.py)
WAN_CROSS_REGION_GBPS = 0.125
ETHERNET_CLASS_GBPS = 12.5  # ib_fallback: InfiniBand silently falls back to the 100 GbE network
MAX_SLOT = 63
PAIRS_PER_SLOT = (1 << 10) - 1
DOWN_RATE_BYTES = 125  # a flapping link's "down" half: 1 kbit/s, connections survive, nothing passes
LOCK_FILE = Path("/tmp/volt-fabric-lo.lock")
OWNERS_DIR = Path("/tmp/volt-fabric-slots")  # <slot>: the state folder of the install that holds it
STATE_NAME = "fabric.json"
LIVE_NAME = "fabric.live"  # an install's processes hold a shared flock on it while they run
SHIM_SOURCE = Path(__file__).resolve().parent / "drivers" / "bindsrc.c"
SHIM_CACHE = Path("/tmp/volt-lib")
_CAP_NET_ADMIN = 12


class EmulationUnavailable(RuntimeError):
    """Links cannot be shaped here; the message says why (shown on pages and in logs)."""


# --- what a link should run at (pure) ---------------------------------------------------------------


@dataclass(frozen=True)
class LinkEnd:
    """One local host as the shaper sees it: address, topology path, declared figures, link faults."""

    address: str
    path: tuple[str, str, str, str]  # region, site, fabric, block (ids as text)
    fabric_gbps: float  # per-host injection bandwidth of its fabric (block level): its ports' where less
    oversubscription: float = 1.0
    declared_gbps: float | None = None  # the fabric's declared per-host figure (None: fabric_gbps)
    backbone_gbps: float = 12.5
    degraded_pct: float = 100.0  # link_degraded:PCT
    ib_fallback: bool = False

    def caps_gbps(self) -> tuple[float, ...]:
        """Cap at each level, finest first: the running minimum of the declared figures (as placement)."""
        # Across blocks the spine gives each host its declared share (declared / oversubscription), which a
        # host whose ports give less than declared does not fill: it still sends at its ports' rate.
        declared = self.fabric_gbps if self.declared_gbps is None else self.declared_gbps
        figures = (
            self.fabric_gbps,
            declared / max(self.oversubscription, 1e-9),
            self.backbone_gbps,
            WAN_SAME_REGION_GBPS,
            WAN_CROSS_REGION_GBPS,
        )
        caps: list[float] = []
        for figure in figures:
            caps.append(min(figure, caps[-1]) if caps else figure)
        return tuple(caps)

    def fault_cap_gbps(self) -> float:
        return ETHERNET_CLASS_GBPS if self.ib_fallback else float("inf")


def common_level(a: LinkEnd, b: LinkEnd) -> str:
    """The finest level one domain of which holds both hosts."""
    region_a, site_a, fabric_a, block_a = a.path
    region_b, site_b, fabric_b, block_b = b.path
    if (site_a, fabric_a, block_a) == (site_b, fabric_b, block_b):
        return "block"
    if (site_a, fabric_a) == (site_b, fabric_b):
        return "fabric"
    if site_a == site_b:
        return "site"
    return "region" if region_a == region_b else "global"


def pair_rate_bytes(a: LinkEnd, b: LinkEnd, scale: float) -> int:
    """Bytes/s from a to b: the shared level's cap of both ends, scaled, with their faults applied."""
    index = LEVELS.index(common_level(a, b))
    gbps = min(a.caps_gbps()[index], b.caps_gbps()[index], a.fault_cap_gbps(), b.fault_cap_gbps())
    gbps *= a.degraded_pct / 100 * b.degraded_pct / 100
    return max(int(gbps * 1e9 * scale), DOWN_RATE_BYTES * 8)


@dataclass
class PairClass:
    src: str
    dst: str
    minor: int
    rate_bytes: int


@dataclass
class InstallState:
    """What this install holds on `lo` (the state file)."""

    slot: int
    pairs: list[PairClass] = field(default_factory=list)

    @property
    def prio(self) -> int:
        return 100 + self.slot

    @property
    def parent_minor(self) -> int:
        return self.slot << 10


def plan_pairs(ends: Sequence[LinkEnd], slot: int, scale: float) -> list[PairClass]:
    """One class per ordered pair of hosts (a host never shapes itself); at most PAIRS_PER_SLOT."""
    pairs = [(a, b) for a in sorted(ends, key=lambda e: e.address) for b in ends if a.address != b.address]
    if len(pairs) > PAIRS_PER_SLOT:
        raise EmulationUnavailable(
            f"{len(ends)} local hosts need {len(pairs)} shaped links; one install can shape {PAIRS_PER_SLOT}"
        )
    return [
        PairClass(a.address, b.address, (slot << 10) | (k + 1), pair_rate_bytes(a, b, scale))
        for k, (a, b) in enumerate(sorted(pairs, key=lambda p: (p[0].address, p[1].address)))
    ]


# --- may we, here? ----------------------------------------------------------------------------------


def has_net_admin() -> bool:
    """Whether this process holds CAP_NET_ADMIN (root has it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> _CAP_NET_ADMIN & 1)
    except OSError:
        pass
    return os.geteuid() == 0


def unavailable_reason(mode: str) -> str | None:
    """Why links cannot be emulated with `mode` ('auto' | 'off'), or None when they can."""
    if mode == "off":
        return "VOLT_LOCAL_FABRIC_EMULATION=off"
    if not has_net_admin():
        return "Volt may not configure the network here (needs root or CAP_NET_ADMIN)"
    if shutil.which("tc") is None:
        return "the tc command (iproute2) is not installed"
    if shutil.which("cc") is None and not _shim_file().exists():
        return "no C compiler to build the source-address shim (bindsrc.so)"
    return None


def _shim_file() -> Path:
    digest = hashlib.sha256(SHIM_SOURCE.read_bytes()).hexdigest()[:12]
    return SHIM_CACHE / f"bindsrc-{digest}.so"


def shim_path() -> Path:
    """The compiled source-address shim, built once per source version (machine-wide cache)."""
    target = _shim_file()
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.tmp")
    result = subprocess.run(
        ["cc", "-shared", "-fPIC", "-O2", "-o", str(partial), str(SHIM_SOURCE), "-ldl"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if result.returncode != 0:
        raise EmulationUnavailable(f"building bindsrc.so failed: {result.stderr.strip()[:300]}")
    partial.replace(target)
    return target


# --- the machine: tc on lo --------------------------------------------------------------------------


@contextmanager
def machine_lock() -> Iterator[None]:
    """One install at a time changes `lo` (installs are separate processes, even separate checkouts)."""
    LOCK_FILE.touch(exist_ok=True)
    with LOCK_FILE.open("r+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _tc(*args: str, check: bool = True) -> str:
    result = subprocess.run(["tc", *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise EmulationUnavailable(f"tc {' '.join(args)}: {(result.stderr or result.stdout).strip()[:300]}")
    return result.stdout


def _tc_batch(lines: list[str]) -> None:
    if not lines:
        return
    result = subprocess.run(
        ["tc", "-force", "-batch", "-"],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    if result.returncode != 0:
        raise EmulationUnavailable(f"tc -batch: {(result.stderr or result.stdout).strip()[:300]}")


def _ensure_root() -> None:
    shown = _tc("qdisc", "show", "dev", DEVICE)
    root = next((line for line in shown.splitlines() if " root " in line), "")
    if root.startswith("qdisc htb 1:"):
        return
    if root.startswith("qdisc noqueue") or not root:
        _tc("qdisc", "add", "dev", DEVICE, "root", "handle", "1:", "htb")  # no default: the rest goes direct
        return
    raise EmulationUnavailable(f"{DEVICE} already has a root qdisc Volt did not make: {root.strip()}")


def _used_slots() -> set[int]:
    slots = set()
    for line in _tc("class", "show", "dev", DEVICE).splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[2].startswith("1:"):
            minor = int(parts[2][2:] or "0", 16)
            slots.add(minor >> 10)
    return slots


def _rate(rate_bytes: int) -> str:
    # A small bucket keeps short probes honest at low rates; HTB lets a 64 KB loopback packet through on
    # credit and makes the class wait it off, so the long-run rate holds.
    burst = max(rate_bytes // 500, 4096)
    return f"rate {rate_bytes * 8}bit ceil {rate_bytes * 8}bit burst {burst} cburst {burst} quantum 65536"


def _class_line(verb: str, minor: int, parent: str, rate_bytes: int) -> str:
    return f"class {verb} dev {DEVICE} parent {parent} classid 1:{minor:x} htb {_rate(rate_bytes)}"


def _remove_slot(state: InstallState) -> None:
    _tc("filter", "del", "dev", DEVICE, "parent", "1:", "prio", str(state.prio), check=False)
    lines = [f"class del dev {DEVICE} classid 1:{pair.minor:x}" for pair in state.pairs]
    existing = {
        line.split()[2] for line in _tc("class", "show", "dev", DEVICE).splitlines() if len(line.split()) > 2
    }
    lines = [line for line in lines if line.split()[5] in existing]
    _tc_batch(lines)
    if f"1:{state.parent_minor:x}" in existing:
        _tc("class", "del", "dev", DEVICE, "classid", f"1:{state.parent_minor:x}", check=False)


def _drop_root_if_unused() -> None:
    if not _tc("class", "show", "dev", DEVICE).strip():
        _tc("qdisc", "del", "dev", DEVICE, "root", check=False)


def read_state(state_dir: Path) -> InstallState | None:
    path = Path(state_dir) / STATE_NAME
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return InstallState(data["slot"], [PairClass(**pair) for pair in data.get("pairs", [])])


def _write_state(state_dir: Path, state: InstallState | None) -> None:
    path = Path(state_dir) / STATE_NAME
    if state is None:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps({"slot": state.slot, "pairs": [asdict(p) for p in state.pairs]}))
    partial.replace(path)


def apply(
    state_dir: Path, ends: Sequence[LinkEnd], scale: float, down: set[str] | None = None
) -> InstallState | None:
    """Shape this install's links to `ends` (none: remove everything it holds). Returns what it holds.

    Rebuilt whole each time (a few hosts: tens of classes, one `tc -batch`); `down` addresses start
    with their links down (a flapping link in its down half).
    """
    down = down or set()
    with machine_lock():
        old = read_state(state_dir)
        if len(ends) < 2:
            if old is not None:
                _remove_slot(old)
                _set_owner(old.slot, None)
                _drop_root_if_unused()
            _write_state(state_dir, None)
            _let_go(state_dir)
            return None
        _ensure_root()
        _clear_foreign(state_dir, {end.address for end in ends}, old.slot if old is not None else None)
        if old is not None and _unchanged(old, ends, scale):
            _hold(state_dir)
            return old  # the health sweep re-syncs every few minutes: leave flowing traffic alone
        if old is not None:
            _remove_slot(old)
        slot = old.slot if old is not None and old.slot not in _used_slots() else _free_slot()
        state = InstallState(slot, plan_pairs(ends, slot, scale))
        total = sum(pair.rate_bytes for pair in state.pairs)
        lines = [_class_line("add", state.parent_minor, "1:", max(total, 1))]
        for pair in state.pairs:
            rate = DOWN_RATE_BYTES if {pair.src, pair.dst} & down else pair.rate_bytes
            lines.append(_class_line("add", pair.minor, f"1:{state.parent_minor:x}", rate))
        for pair in state.pairs:
            lines.append(
                f"filter add dev {DEVICE} parent 1: protocol ip prio {state.prio} u32 "
                f"match ip src {pair.src}/32 match ip dst {pair.dst}/32 flowid 1:{pair.minor:x}"
            )
        try:
            _tc_batch(lines)
        except EmulationUnavailable:
            _remove_slot(state)
            _drop_root_if_unused()
            _write_state(state_dir, None)
            raise
        _write_state(state_dir, state)
        _hold(state_dir)
        _set_owner(state.slot, state_dir)
        return state


def _set_owner(slot: int, state_dir: Path | None) -> None:
    path = OWNERS_DIR / str(slot)
    if state_dir is None:
        path.unlink(missing_ok=True)
        return
    OWNERS_DIR.mkdir(parents=True, exist_ok=True)
    path.write_text(str(Path(state_dir).resolve()))


_HELD: dict[Path, object] = {}  # state folders this process keeps alive: the open file of each flock


def _hold(state_dir: Path) -> None:
    """Mark this process as one of the install's while it runs: a shared flock, released by the kernel
    when the process ends however it ends (a crashed demo, a killed test stack, a test run that is over)."""
    path = Path(state_dir).resolve() / LIVE_NAME
    if path in _HELD:
        return
    handle = path.open("a")
    fcntl.flock(handle, fcntl.LOCK_SH)
    _HELD[path] = handle


def _let_go(state_dir: Path) -> None:
    handle = _HELD.pop(Path(state_dir).resolve() / LIVE_NAME, None)
    if handle is not None:
        handle.close()


def _running(state_dir: Path) -> bool:
    """Whether a process of the install at `state_dir` is still running (holds its flock)."""
    try:
        handle = (Path(state_dir) / LIVE_NAME).open("r")
    except OSError:
        return False
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True  # held, if only by this process under another open file
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False


def _owner_alive(slot: int) -> Path | None:
    """The state folder of the live install that holds `slot`, or None when that install is gone: its
    state no longer names the slot (its folder deleted, its links removed), or none of its processes runs
    (a folder left behind: pytest keeps its last runs' temporary folders, a demo killed with SIGKILL)."""
    try:
        owner = Path((OWNERS_DIR / str(slot)).read_text().strip())
    except OSError:
        return None
    state = read_state(owner)
    return owner if state is not None and state.slot == slot and _running(owner) else None


def _hex_address(value: str) -> str:
    number = int(value, 16)
    return ".".join(str(number >> shift & 0xFF) for shift in (24, 16, 8, 0))


def slots_shaping(addresses: set[str]) -> dict[int, set[str]]:
    """Slot -> which of `addresses` its u32 filters match (source or destination), as `lo` holds them."""
    found: dict[int, set[str]] = {}
    slot = None
    for line in _tc("filter", "show", "dev", DEVICE).splitlines():
        parts = line.split()
        if line.startswith("filter") and "pref" in parts:
            prio = int(parts[parts.index("pref") + 1])
            slot = prio - 100 if 100 < prio <= 100 + MAX_SLOT else None
        elif parts[:1] == ["match"] and slot is not None:
            address = _hex_address(parts[1].split("/")[0])
            if address in addresses:
                found.setdefault(slot, set()).add(address)
    return found


def _clear_foreign(state_dir: Path, addresses: set[str], own_slot: int | None) -> None:
    """Remove dead installs' links on `addresses`; a live install's: EmulationUnavailable naming it."""
    for slot, shared in sorted(slots_shaping(addresses).items()):
        if slot == own_slot:
            continue
        owner = _owner_alive(slot)
        if owner is not None and owner != Path(state_dir).resolve():
            raise EmulationUnavailable(
                f"{', '.join(sorted(shared))} are shaped by another Volt install ({owner}); give this "
                "install's local hosts other addresses or stop that one"
            )
        minors = [
            int(line.split()[2][2:], 16)
            for line in _tc("class", "show", "dev", DEVICE).splitlines()
            if len(line.split()) > 2 and line.split()[2].startswith("1:")
        ]
        mine = [m for m in minors if m >> 10 == slot]
        pairs = [PairClass("", "", minor, 0) for minor in mine if minor != slot << 10]
        _remove_slot(InstallState(slot, pairs))
        _set_owner(slot, None)


def _unchanged(old: InstallState, ends: Sequence[LinkEnd], scale: float) -> bool:
    """Whether `old` already holds exactly these links at these rates, and they are still on `lo`."""
    try:
        wanted = plan_pairs(ends, old.slot, scale)
    except EmulationUnavailable:
        return False
    if [asdict(p) for p in wanted] != [asdict(p) for p in old.pairs]:
        return False
    shown = _tc("class", "show", "dev", DEVICE)
    return all(f"1:{p.minor:x} " in shown for p in old.pairs) and f"1:{old.parent_minor:x} " in shown


def _free_slot() -> int:
    used = _used_slots()
    slot = next((s for s in range(1, MAX_SLOT + 1) if s not in used), None)
    if slot is None:
        raise EmulationUnavailable(f"every one of the {MAX_SLOT} emulation slots on {DEVICE} is taken")
    return slot


def remove(state_dir: Path) -> None:
    """Remove whatever this install shaped (idempotent)."""
    apply(state_dir, [], 1.0)


def set_link_state(state_dir: Path, address: str, up: bool) -> bool:
    """Put `address`'s links at their rate (up) or at DOWN_RATE_BYTES; False when it has no links."""
    with machine_lock():
        state = read_state(state_dir)
        mine = [p for p in (state.pairs if state else []) if address in (p.src, p.dst)]
        if not mine:
            return False
        _tc_batch(
            [
                _class_line(
                    "change", p.minor, f"1:{state.parent_minor:x}", p.rate_bytes if up else DOWN_RATE_BYTES
                )
                for p in mine
            ]
        )
        return True


# --- link_flapping: a small process per flapping host -----------------------------------------------


def flap(state_dir: Path, address: str, fault_file: Path, period_s: float, max_s: float) -> None:
    """Toggle `address`'s links every `period_s` until the fault file goes, the host's links go, or max_s."""
    deadline = time.monotonic() + max_s
    up = True
    try:
        while time.monotonic() < deadline and fault_file.exists():
            up = not up
            if not set_link_state(state_dir, address, up):
                return
            time.sleep(period_s)
    finally:
        if not up:
            set_link_state(state_dir, address, True)


def start_flapping(state_dir: Path, address: str, fault_file: Path, period_s: float, max_s: float) -> int:
    """Start the flapping process for one host (detached); returns its PID, also written next to the fault."""
    args = [sys.executable, "-m", "inventory.fabric_emulation", "flap", str(state_dir), address,
            str(fault_file), str(period_s), str(max_s)]  # fmt: skip
    proc = subprocess.Popen(
        args,
        cwd=str(Path(__file__).resolve().parents[1]),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    fault_file.with_name(".link_flapping.pid").write_text(str(proc.pid))
    return proc.pid


def stop_flapping(fault_file: Path) -> None:
    """Stop a host's flapping process (it restores the links on its way out)."""
    pid_file = fault_file.with_name(".link_flapping.pid")
    try:
        pid = int(pid_file.read_text())
    except (OSError, ValueError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
        for _ in range(50):
            os.kill(pid, 0)
            time.sleep(0.05)
    except ProcessLookupError:
        pass
    pid_file.unlink(missing_ok=True)


def _on_sigterm(signum, frame) -> None:
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Volt emulated fabric helper.")
    sub = parser.add_subparsers(dest="command", required=True)
    flapping = sub.add_parser("flap", help="toggle a host's links until its fault file goes")
    flapping.add_argument("state_dir", type=Path)
    flapping.add_argument("address")
    flapping.add_argument("fault_file", type=Path)
    flapping.add_argument("period_s", type=float)
    flapping.add_argument("max_s", type=float)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    flap(args.state_dir, args.address, args.fault_file, args.period_s, args.max_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
