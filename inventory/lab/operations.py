"""What `manage.py lab` does: bring a lab up and down, report it, cut a machine's power or cable.

    up ─▶ clean what a crashed lab left ─▶ state file (starting) ─▶ router namespace, a bridge per provider
       ─▶ per machine: namespace + veth + address, disk, /etc, host key, tools ─▶ shape the links (tc)
       ─▶ the gate (root-namespace sockets, router-namespace process) ─▶ power every machine on, wait for
          its sshd ─▶ state file (up)
    down ─▶ SIGKILL each machine's PID 1 and the gate (by recorded PID), then every process left in a lab
       namespace ─▶ delete the namespaces (their links and bridges go with them) ─▶ remove the lab folder

Each step is recorded in the state file before it is made (inventory/lab/state.py), and `down` also finds
namespaces by name, so a lab whose `up` was killed half-way is removed by `down` or by the next `up`.
Every function takes the lab's base folder and number, and `say` for progress lines.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from inventory.lab import gate, machines, network, state
from inventory.lab.state import LabState, MachineState, ProcessRef
from inventory.lab.topology import CONTROL_ADDRESS, Topology, TopologyError, as_json, build, from_json

Say = Callable[[str], None]
KEY_NAME = "id_ed25519"
# What the lab runs, and the Debian package that brings it.
REQUIRED = {
    "ip": "iproute2",
    "tc": "iproute2",
    "unshare": "util-linux",
    "nsenter": "util-linux",
    "su": "login",
    "sudo": "sudo",
    "sshd": "openssh-server",
    "nft": "nftables",
    "python3": "python3",
}
_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class LabError(RuntimeError):
    """A lab command cannot do what was asked; the message says why and what to do."""


@dataclass(frozen=True)
class MachineStatus:
    """One machine as `lab status` shows it, with what it takes to log in through its gate."""

    name: str
    provider: str
    site: str
    block: str
    gpus: str
    address: str
    gate: str
    gate_port: int
    power: str  # "on", "off", or "off (PID 1 ended)" when it stopped by itself
    plugged: bool
    host_key: str
    pid1: int | None
    public: str = ""  # a NAT'd provider's forwards: "ssh ADDRESS:PORT, udp ADDRESS:PORT" ("" when routed)


@dataclass(frozen=True)
class LabStatus:
    lab: int
    status: str
    scale: float
    login_user: str
    key_path: Path
    shared: Path
    machines: tuple[MachineStatus, ...]
    store_endpoint: str = ""  # the checkpoint store as the machines reach it ("" when they cannot)

    def machine(self, name: str) -> MachineStatus:
        return next(m for m in self.machines if m.name == name)


def problems() -> list[str]:
    """Why the lab cannot run here (empty when it can)."""
    if os.geteuid() != 0:
        return [
            "the lab makes network, mount and PID namespaces, links and mounts, which needs root: run it as "
            "root, e.g. `sudo .venv/bin/python manage.py lab up`"
        ]
    missing = {package for tool, package in REQUIRED.items() if shutil.which(tool, path=_SYSTEM_PATH) is None}
    found = []
    if missing:
        found.append(f"missing tools: apt-get install -y {' '.join(sorted(missing))}")
    if "overlay" not in Path("/proc/filesystems").read_text():
        found.append("this kernel has no overlay filesystem (machines' /etc): `modprobe overlay`")
    return found


def _require() -> None:
    found = problems()
    if found:
        raise LabError("; ".join(found))


def _check_base(base: Path) -> None:
    resolved = base.resolve()
    for target in machines.MOUNTED_OVER:
        if resolved == Path(target) or resolved.is_relative_to(target):
            raise LabError(
                f"the lab's folder {base} is under {target}, which every machine mounts its own over: "
                "set VOLT_LAB_DIR elsewhere (default /var/lib/volt-lab)"
            )


@contextmanager
def _locked(lab: int) -> Iterator[None]:
    with state.lock(lab):
        yield


# --- up -----------------------------------------------------------------------------------------


def up(
    base: Path,
    lab: int,
    declared: dict,
    scale: float,
    gate_port: int = machines.SSH_PORT,
    default_nics: Callable[[str, int, str], list] | None = None,
    say: Say = print,
    services: dict[str, str] | None = None,
    store_endpoint: str = "",
) -> LabState:
    """Bring lab `lab` up from the `declared` topology; a crashed lab of that number is removed first.
    `services` ({"10.77.0.1:5432": "127.0.0.1:5432"}, `control_services`) are what control machines reach;
    the checkpoint store at `store_endpoint` (VOLT_STORE_ENDPOINT), when on this box's loopback, is what every
    machine reaches at 10.77.0.1 (`LabState.store_endpoint`, for VOLT_STORE_NODE_ENDPOINT)."""
    _check_base(Path(base))
    _require()
    try:
        topology = build(lab, declared, default_nics)
    except TopologyError as exc:
        raise LabError(str(exc)) from None
    directory = state.lab_dir(base, lab)
    with _locked(lab):
        previous = state.read(directory)
        if previous is not None and previous.status == state.UP and previous.gate and previous.gate.alive():
            raise LabError(f"lab {lab} is already up ({len(previous.machines)} machines): `lab down` first")
        if previous is not None or network.namespaces(lab) or directory.exists():
            say(f"lab {lab}: removing what an earlier lab left behind")
            _teardown(Path(base), lab, say)
        try:
            return _make(directory, topology, scale, gate_port, say, services or {}, store_endpoint)
        except BaseException:
            say(f"lab {lab} did not come up: removing what was made")
            _teardown(Path(base), lab, say)
            raise


def _make(
    directory: Path,
    topology: Topology,
    scale: float,
    gate_port: int,
    say: Say,
    services: dict[str, str],
    store_endpoint: str = "",
) -> LabState:
    lab = topology.lab
    store_route, node_endpoint = store_service(store_endpoint)
    record = LabState(
        lab=lab,
        owner=ProcessRef.of(os.getpid()),
        scale=scale,
        topology=as_json(topology),
        gate_port=gate_port,
        login_uid=machines.free_uid(),
        run_netns_was_mounted=network.run_netns_is_mounted(),
        services=dict(services) if any(m.role == "control" for m in topology.machines) else {},
        store_route=store_route,
        store_endpoint=node_endpoint,
    )
    directory.mkdir(parents=True, mode=0o700)
    state.write(directory, record)
    shared = machines.shared_dir(directory)
    shared.mkdir()
    shared.chmod(0o1777)
    private, public = machines.key_pair()
    (directory / KEY_NAME).write_text(private)
    (directory / KEY_NAME).chmod(0o600)
    (directory / f"{KEY_NAME}.pub").write_text(public + "\n")
    login = machines.LoginUser(record.login_user, record.login_uid, public)
    python = shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3"

    router = network.router_namespace(lab)
    _add_namespace(directory, record, router)
    network.make_router(lab, topology.providers)
    nets = ", ".join(f"{p.name} {p.network}" for p in topology.providers)
    say(f"lab {lab}: router namespace {router} (provider networks: {nets})")
    for machine in topology.machines:
        _add_namespace(directory, record, network.machine_namespace(lab, machine.name))
        network.link_machine(lab, machine, topology.provider(machine.provider))
        host_key = machines.prepare(directory, topology, machine, login, python, gate_port)
        record.machines[machine.name] = MachineState(host_key=host_key)
        state.write(directory, record)
        what = (
            "control machine"
            if machine.role == "control"
            else f"{machine.spec['gpu_count']} x {machine.spec['gpu_model']}"
        )
        say(f"  {machine.name}: {machine.address} on {machine.provider}, block {machine.block}, "
            f"{what}, gate {machine.gate}:{gate_port}")  # fmt: skip
    network.apply_nat(lab, topology)
    for provider in (p for p in topology.providers if p.nat):
        udp = "SSH and one UDP port per machine" if provider.forward_udp else "SSH alone (no UDP port)"
        say(f"{provider.name} is behind NAT at {provider.public_address}: its gateway forwards {udp}")
    network.shape(lab, topology, scale)
    say(f"links shaped to the topology's level rates x {scale:g} (tc on the router's end of each veth)")
    _start_gate(directory, record, topology, services)
    if any(m.role == "control" for m in topology.machines):
        offered = (
            ", ".join(f"{k} (→ {v})" for k, v in services.items()) or "nothing (no loopback TCP service)"
        )
        say(f"control machines reach the control plane's services at {offered}")
    if node_endpoint:
        say(f"every machine reaches the checkpoint store at {node_endpoint} (→ {store_endpoint})")
    _boot(directory, record, topology, [m.name for m in topology.machines])
    record.status, record.owner = state.UP, None
    state.write(directory, record)
    say(f"lab {lab} is up: {len(topology.machines)} machines; log in with "
        f"ssh -i {directory / KEY_NAME} -p {gate_port} {record.login_user}@<gate>   (`lab status` lists them)")  # fmt: skip
    return record


def _forwards(machine) -> str:
    if not machine.public_address:
        return ""
    ssh = f"ssh {machine.ssh_target}"
    return f"{ssh}, udp {machine.udp_endpoint}" if machine.udp_endpoint else f"{ssh}, no udp"


def _add_namespace(directory: Path, record: LabState, name: str) -> None:
    record.namespaces.append(name)
    state.write(directory, record)  # named in the state before it exists
    network.add_namespace(name)


def _start_gate(directory: Path, record: LabState, topology: Topology, services: dict[str, str]) -> None:
    routes = {f"{m.gate}:{record.gate_port}": m.ssh_target for m in topology.machines}
    netns = str(network.NETNS_DIR / network.router_namespace(topology.lab))
    control = tuple(m.address for m in topology.machines if m.role == "control")
    try:
        pid = gate.start(
            netns, directory / "gate.log", routes, services if control else {}, control, record.store_route
        )
    except RuntimeError as exc:
        hint = " (is another sshd or lab listening there? pick another with --gate-port)"
        raise LabError(f"{exc}{hint if 'in use' in str(exc) else ''}") from None
    record.gate = ProcessRef.of(pid)
    state.write(directory, record)


def _boot(directory: Path, record: LabState, topology: Topology, names: list[str]) -> None:
    """Power on `names` together, then wait for each sshd."""
    offsets = {}
    for name in names:
        offsets[name] = machines.console_offset(directory, name)
        namespace = network.machine_namespace(topology.lab, name)
        record.machines[name].launcher = machines.power_on(directory, topology.machine(name), namespace)
        record.machines[name].power = state.POWER_ON
        state.write(directory, record)
    for name in names:
        entry = record.machines[name]
        try:
            entry.pid1 = machines.wait_booted(
                directory, topology.machine(name), entry.launcher, offsets[name]
            )
        except machines.MachineError as exc:
            entry.power, entry.launcher = state.POWER_OFF, None
            state.write(directory, record)
            raise LabError(str(exc)) from None
        state.write(directory, record)


# --- down ---------------------------------------------------------------------------------------


def down(base: Path, lab: int, say: Say = print) -> bool:
    """Remove lab `lab` whole (a crashed one too); False when there was nothing to remove."""
    _require()
    directory = state.lab_dir(base, lab)
    with _locked(lab):
        record = state.read(directory)
        if record is None and not network.namespaces(lab) and not directory.exists():
            say(f"lab {lab} is not up: nothing to remove")
            return False
        if record is not None:
            record.status = state.STOPPING
            state.write(directory, record)
        _teardown(Path(base), lab, say)
    say(f"lab {lab} is down: no namespace, link, mount or process of it is left")
    return True


def _teardown(base: Path, lab: int, say: Say) -> None:
    directory = state.lab_dir(base, lab)
    record = state.read(directory)
    if record is not None:
        for entry in record.machines.values():
            machines.power_off(entry.pid1, entry.launcher)
        machines.kill(record.gate)
        machines.wait_gone(record.gate)
    names = sorted(set(network.namespaces(lab)) | set(record.namespaces if record else ()))
    for name in names:
        _end_processes(name)
    for name in names:
        network.delete_namespace(name)
    if names:
        say(f"  removed namespaces {', '.join(names)}")
    if record is not None and not record.run_netns_was_mounted:
        network.unmount_run_netns_if_empty()
    if directory.exists():
        shutil.rmtree(directory)
        say(f"  removed {directory}")
    try:
        Path(base).rmdir()  # only when no other lab is left in it
    except OSError:
        pass


def _end_processes(namespace: str) -> None:
    """SIGKILL every process left in a lab namespace (each was started in the lab), until none is left."""
    for _attempt in range(100):
        left = [ProcessRef.of(pid) for pid in network.pids(namespace)]
        left = [ref for ref in left if ref is not None]
        if not left:
            return
        for ref in left:
            machines.kill(ref)
        for ref in left:
            machines.wait_gone(ref, timeout_s=2.0)
    raise LabError(f"processes of namespace {namespace} would not end: {network.pids(namespace)}")


# --- status, power, cables, commands --------------------------------------------------------------


def read_lab(base: Path, lab: int) -> tuple[LabState, Topology]:
    """The state and topology of lab `lab`, which must be up (LabError otherwise)."""
    record = state.read(state.lab_dir(base, lab))
    if record is None:
        raise LabError(f"lab {lab} is not up: `lab up` first")
    return record, from_json(record.topology)


def status(base: Path, lab: int) -> LabStatus:
    record, topology = read_lab(base, lab)
    rows = []
    for machine in topology.machines:
        entry = record.machines.get(machine.name, MachineState())
        alive = entry.pid1 is not None and entry.pid1.alive()
        power = state.POWER_ON if alive else state.POWER_OFF
        if not alive and entry.power == state.POWER_ON and entry.pid1 is not None:
            power = "off (PID 1 ended)"
        rows.append(
            MachineStatus(
                name=machine.name,
                provider=machine.provider,
                site=machine.site,
                block=machine.block,
                gpus="control"
                if machine.role == "control"
                else f"{machine.spec['gpu_count']} x {machine.spec['gpu_model']}",
                address=machine.address,
                gate=machine.gate,
                gate_port=record.gate_port,
                power=power,
                plugged=entry.plugged,
                host_key=entry.host_key,
                pid1=entry.pid1.pid if alive else None,
                public=_forwards(machine),
            )
        )
    directory = state.lab_dir(base, lab)
    return LabStatus(
        lab=lab,
        status=record.status,
        scale=record.scale,
        login_user=record.login_user,
        key_path=directory / KEY_NAME,
        shared=machines.shared_dir(directory),
        machines=tuple(rows),
        store_endpoint=record.store_endpoint,
    )


def labs(base: Path) -> list[int]:
    """The labs with a folder under `base`."""
    if not Path(base).is_dir():
        return []
    found = [p.name[3:] for p in Path(base).iterdir() if p.name.startswith("lab") and p.name[3:].isdigit()]
    return sorted(int(n) for n in found)


def _machine(base: Path, lab: int, name: str):
    record, topology = read_lab(base, lab)
    try:
        machine = topology.machine(name)
    except TopologyError as exc:
        raise LabError(str(exc)) from None
    return record, topology, machine, record.machines[name]


def power_off(base: Path, lab: int, name: str, say: Say = print) -> None:
    """Cut `name`'s power: SIGKILL its PID 1, which ends every process of the machine, and destroy its TCP
    sockets, so that nothing it had queued still reaches a peer."""
    _require()
    with _locked(lab):
        record, _topology, _machine_, entry = _machine(base, lab, name)
        if entry.pid1 is None or not entry.pid1.alive():
            say(f"{name} is already off")
        else:
            machines.power_off(entry.pid1, entry.launcher)
            network.drop_connections(lab, name)  # and what its kernel still had to send for them
            say(f"{name} is off: PID 1 (host PID {entry.pid1.pid}) and every process of the machine ended")
        entry.power, entry.pid1, entry.launcher = state.POWER_OFF, None, None
        state.write(state.lab_dir(base, lab), record)


def power_on(base: Path, lab: int, name: str, say: Say = print) -> None:
    """Boot `name` again: a new PID 1 (its sshd, with the same host key and disk)."""
    _require()
    with _locked(lab):
        record, topology, _machine_, entry = _machine(base, lab, name)
        if entry.pid1 is not None and entry.pid1.alive():
            say(f"{name} is already on")
            return
        machines.power_off(None, entry.launcher)
        _boot(state.lab_dir(base, lab), record, topology, [name])
        say(f"{name} is on: sshd is its PID 1 (host PID {record.machines[name].pid1.pid})")


def set_plugged(base: Path, lab: int, name: str, plugged: bool, say: Say = print) -> None:
    """Plug or unplug `name`'s cable (its link to its provider's bridge)."""
    _require()
    with _locked(lab):
        record, _topology, machine, entry = _machine(base, lab, name)
        network.set_plugged(lab, machine, plugged)
        entry.plugged = plugged
        state.write(state.lab_dir(base, lab), record)
    say(f"{name} is {'plugged in' if plugged else 'unplugged: its link is down'}")


def command_in(base: Path, lab: int, name: str, argv: list[str], user: str | None = None) -> list[str]:
    """The command line that runs `argv` inside machine `name` (as root, or as `user`), as its console
    would; the machine must be on."""
    _record, _topology, _machine_, entry = _machine(base, lab, name)
    if entry.pid1 is None or not entry.pid1.alive():
        raise LabError(f"{name} is off: `lab power-on {name}` first")
    return machines.enter_command(entry.pid1, argv, user)


def control_services(database: dict, redis_url: str) -> dict[str, str]:
    """The gate's back routes for the control plane's PostgreSQL and Redis, where they listen on a loopback
    address of this box: {"10.77.0.1:<port>": "<loopback>:<port>"}. Others (a Unix socket, another server
    that control machines would reach by themselves) are left out."""
    found = []
    if "postgresql" in database.get("ENGINE", ""):
        found.append((database.get("HOST") or "", int(database.get("PORT") or 5432)))
    parsed = urlsplit(redis_url)
    if parsed.scheme == "redis":
        found.append((parsed.hostname or "", parsed.port or 6379))
    services = {}
    for host, port in found:
        target = "127.0.0.1" if host == "localhost" else host
        if _loopback(target) and ":" not in target:
            services[f"{CONTROL_ADDRESS}:{port}"] = f"{target}:{port}"
    return services


def store_service(endpoint: str) -> tuple[dict[str, str], str]:
    """The gate's open back route for the checkpoint store's S3 API at `endpoint` when it listens on this box's
    loopback ({"10.77.0.1:<port>": "<loopback>:<port>"}), and the endpoint machines then use; ({}, "")
    otherwise (no store, or one the machines reach by themselves)."""
    parsed = urlsplit(endpoint or "")
    host = "127.0.0.1" if parsed.hostname == "localhost" else (parsed.hostname or "")
    if parsed.scheme != "http" or not _loopback(host) or ":" in host or not parsed.port:
        return {}, ""
    return {
        f"{CONTROL_ADDRESS}:{parsed.port}": f"{host}:{parsed.port}"
    }, f"http://{CONTROL_ADDRESS}:{parsed.port}"


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def control_url(url: str, services: dict[str, str], what: str) -> str:
    """`url` (a database or Redis URL naming a loopback address of this box) as a control machine reaches it:
    through the gate's back route at CONTROL_ADDRESS, same port. Refused, saying why, where no route
    carries it (`services`: the routes the lab came up with)."""
    parsed = urlsplit(url)
    host = parsed.hostname or ""
    default = {"redis": 6379}.get(parsed.scheme, 5432)
    port = parsed.port or default
    if not _loopback(host) or ":" in host:
        raise LabError(
            f"{what} names {host or 'a socket'}: the lab carries only this box's loopback TCP services (an "
            "IPv4 address in 127.0.0.0/8) to control machines"
        )
    if f"{CONTROL_ADDRESS}:{port}" not in services:
        raise LabError(
            f"{what}'s port {port} has no route to control machines in this lab: bring the lab up with the "
            f"same {what} in the environment (`sudo -E … lab up`)"
        )
    userinfo = parsed.netloc.rpartition("@")[0]
    netloc = (userinfo + "@" if userinfo else "") + f"{CONTROL_ADDRESS}:{port}"
    return urlunsplit(parsed._replace(netloc=netloc))


# Where a control machine's Volt keeps what it writes (its own /var/tmp): the install is read-only there.
CONTROL_DATA_DIR = "/var/tmp/volt"
_PASSED = ("DJANGO_SETTINGS_MODULE", "SECRET_KEY", "DEBUG", "ALLOWED_HOSTS", "LOG_LEVEL", "LANG", "TZ")
_PASSED_PREFIXES = ("VOLT_", "CELERY_", "DB_")
# Not reachable from lab machines yet (the checkpoint store has no route): a worker there goes without.
_NOT_PASSED = ("VOLT_LAB_DIR", "VOLT_STORE_ENDPOINT", "VOLT_STORE_ACCESS_KEY", "VOLT_STORE_SECRET_KEY")


def worker_environment(base: Path, lab: int, environ: dict[str, str]) -> dict[str, str]:
    """A control machine's worker environment from this process's: the same settings (VOLT_*, CELERY_*,
    DB_*, the secret key, which decrypts the hosts' SSH keys), the same install (VOLT_INSTALL_ID, which must
    be set: an id derived from the data dir differs on another machine), PostgreSQL and Redis through the
    gate. It holds secrets: give it to the process as its environment, never on a command line."""
    record, _topology = read_lab(base, lab)
    if not re.fullmatch(r"[a-z0-9]{1,12}", environ.get("VOLT_INSTALL_ID", "")):
        raise LabError(
            "set VOLT_INSTALL_ID (1-12 lower-case letters or digits) for the whole install — web, workers, "
            "beat and `lab worker` — so that every machine names clusters, users and channels alike"
        )
    database = environ.get("DATABASE_URL", "")
    if not database.startswith(("postgres://", "postgresql://")):
        raise LabError(
            "a worker on a control machine needs the control plane's PostgreSQL: set DATABASE_URL "
            "(e.g. postgres://postgres@127.0.0.1:5432/volt) for Volt and for `lab worker`"
        )
    if not environ.get("REDIS_URL", "").startswith("redis://"):
        raise LabError("a worker on a control machine needs REDIS_URL (e.g. redis://127.0.0.1:6379/1)")
    env = {k: v for k, v in environ.items() if k.startswith(_PASSED_PREFIXES) or k in _PASSED}
    for name in _NOT_PASSED:
        env.pop(name, None)
    env.update(
        PATH=_SYSTEM_PATH,
        HOME="/root",
        DATABASE_URL=control_url(database, record.services, "DATABASE_URL"),
        REDIS_URL=control_url(environ["REDIS_URL"], record.services, "REDIS_URL"),
        VOLT_DATA_DIR=CONTROL_DATA_DIR,
        PYTHONDONTWRITEBYTECODE="1",
    )
    if environ.get("CELERY_BROKER_URL"):
        env["CELERY_BROKER_URL"] = control_url(
            environ["CELERY_BROKER_URL"], record.services, "CELERY_BROKER_URL"
        )
    return env


def worker_command(base: Path, lab: int, name: str, celery_args: list[str]) -> list[str]:
    """The command line that runs a Volt Celery worker on control machine `name`, in all its namespaces (a
    power-off ends it): Volt's install at its own path, its own Python. Run it with `worker_environment`'s
    result as its whole environment (nsenter and sh pass it on): the command line holds no secret, as every
    user of the box may read it."""
    _record, _topology, machine, _entry = _machine(base, lab, name)
    if machine.role != "control":
        raise LabError(f'{name} is not a control machine: give it "role": "control" in the topology')
    celery = [str(machines.VOLT_DIR / ".venv" / "bin" / "celery"), "-A", "voltweb", "worker", *celery_args]
    script = f"cd {shlex.quote(str(machines.VOLT_DIR))} && exec {shlex.join(celery)}"
    return command_in(base, lab, name, ["sh", "-c", script])


def run_in(
    base: Path, lab: int, name: str, argv: list[str], user: str | None = None, timeout_s: float = 60.0
) -> subprocess.CompletedProcess:
    """`argv` run inside machine `name`, its output captured."""
    command = command_in(base, lab, name, argv, user)
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
