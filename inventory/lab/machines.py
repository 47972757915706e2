"""A lab machine: its disk, its own /etc, its sshd as PID 1, its simulated GPU tools, its power.

A machine is made of namespaces of this box. `power_on` starts, inside the machine's network namespace,

    unshare --pid --fork --mount --uts --propagation private --kill-child -- /bin/sh init.sh

whose forked child is PID 1 of a new PID namespace. init.sh mounts, in the machine's own mount
namespace (nothing propagates back), a fresh /proc; its disk's folders over /opt, /home, /root, /tmp and
/var/tmp; an overlay on /etc (the box's /etc below, the machine's own files above: its host name, hosts,
users, sudoers, sshd config and host key; what it writes stays its own); an overlay on /usr/local/bin
holding its simulated `nvidia-smi` and `ibstat`; tmpfs on /run and /dev/shm; and the lab's shared folder
at /mnt/volt-shared. It sets the host name; last, its disk's var-lib over /var/lib and, where the lab's
folder lies elsewhere, an empty tmpfs over it: a machine sees neither the box's /var/lib (Volt's database
files, the default lab folder) nor the other machines' disks, and what it writes there stays its own
(earlier, every machine shared the box's /var/lib: overlay keys written there were one file for all). It
then execs sshd, which becomes PID 1. Killing PID 1 ends every process of the PID namespace at once: that
is `power_off`.

On disk (`<lab dir>/machines/<name>/`): `disk/{opt,home,root,tmp,var-tmp,var-lib}`, `etc/` and `usr-local-bin/`
(the overlays' upper layers, with `work/` beside them), `init.sh`, and `console.log` (what init and sshd
print). The simulated tools read `/opt/volt-lab/` (spec.json, faults/, sys/class/infiniband), a copy of
the `local` driver's simulator run by the box's python3, so nothing under the checkout or its venv (which
may live in a folder the machine mounts over) is needed inside.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from inventory.drivers.simulator import sysfs_tree
from inventory.lab.state import ProcessRef, parent_pid, start_time
from inventory.lab.topology import SSH_PORT, Machine, Topology

INVENTORY_DIR = Path(__file__).resolve().parents[1]
VOLT_DIR = INVENTORY_DIR.parent  # Volt's install, which control machines see at its path
DISKS = {"opt": "/opt", "home": "/home", "root": "/root", "tmp": "/tmp", "var-tmp": "/var/tmp"}
SHARED_MOUNT = "/mnt/volt-shared"
# What a machine's init mounts over: a lab's folder under one of them would vanish from its own view.
MOUNTED_OVER = (
    "/opt",
    "/home",
    "/root",
    "/tmp",
    "/var/tmp",
    "/etc",
    "/usr/local/bin",
    "/run",
    "/dev/shm",
    "/mnt",
)
TOOLS_ROOT = "/opt/volt-lab"  # VOLT_HOST_ROOT inside a machine
BOOT_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0
# What the simulator imports (all pure Python): copied into every machine.
_SIMULATOR_FILES = ("drivers/simulator.py", "discovery/types.py", "gpu_catalog.py")
_PACKAGES = ("inventory", "inventory/drivers", "inventory/discovery")


class MachineError(RuntimeError):
    """A machine would not start or stop; the message says what it printed."""


@dataclass(frozen=True)
class LoginUser:
    """The machine's login user (with passwordless sudo) and the key that logs in as it."""

    name: str
    uid: int
    public_key: str  # "ssh-ed25519 AAAA…"


def machine_dir(lab_dir: Path, name: str) -> Path:
    return Path(lab_dir) / "machines" / name


def shared_dir(lab_dir: Path) -> Path:
    return Path(lab_dir) / "shared"


def free_uid(start: int = 2000) -> int:
    """A uid (and gid) no user or group of this box has, for the machines' login user."""
    taken = set()
    for table in ("/etc/passwd", "/etc/group"):
        for line in Path(table).read_text().splitlines():
            parts = line.split(":")
            if len(parts) > 2 and parts[2].isdigit():
                taken.add(int(parts[2]))
    uid = start
    while uid in taken:
        uid += 1
    return uid


def key_pair() -> tuple[str, str]:
    """(OpenSSH private key text, "ssh-ed25519 AAAA…") of a fresh ed25519 key."""
    key = asyncssh.generate_private_key("ssh-ed25519")
    public = " ".join(key.export_public_key("openssh").decode().split()[:2])
    return key.export_private_key("openssh").decode(), public


# --- laying a machine out -----------------------------------------------------------------------


def prepare(
    lab_dir: Path,
    topology: Topology,
    machine: Machine,
    login: LoginUser,
    python: str,
    gate_port: int = SSH_PORT,
) -> str:
    """Lay out `machine`'s disk, /etc and tools; returns its host public key ("ssh-ed25519 AAAA…")."""
    root = machine_dir(lab_dir, machine.name)
    for sub, mode in (
        ("opt", 0o755),
        ("home", 0o755),
        ("root", 0o700),
        ("tmp", 0o1777),
        ("var-tmp", 0o1777),
        ("var-lib", 0o755),
    ):
        (root / "disk" / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(root / "disk" / sub, mode)
    for sub in ("etc", "etc-work", "usr-local-bin", "usr-local-bin-work"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    host_key = _write_etc(root / "etc", topology, machine, login)
    _write_home(root / "disk" / "home", login)
    _write_tools(root, machine, python)
    script = _init_script(root, shared_dir(lab_dir), machine)
    if machine.role == "control":
        script = _control_init(root, topology, machine, python, gate_port, script)
    (root / "init.sh").write_text(script)
    return host_key


def _write_etc(etc: Path, topology: Topology, machine: Machine, login: LoginUser) -> str:
    (etc / "ssh").mkdir(exist_ok=True)
    private, public = key_pair()
    key_path = etc / "ssh" / "ssh_host_ed25519_key"
    key_path.write_text(private)
    key_path.chmod(0o600)
    (etc / "ssh" / "ssh_host_ed25519_key.pub").write_text(public + f" root@{machine.name}\n")
    (etc / "ssh" / "sshd_config").write_text(_sshd_config(machine, login))
    (etc / "hostname").write_text(machine.name + "\n")
    # Every machine's name resolves to its lab address, its own included (as on a cluster's hosts).
    hosts = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost"]
    hosts += [f"{m.address}\t{m.name}" for m in topology.machines]
    (etc / "hosts").write_text("\n".join(hosts) + "\n")
    user_line = f"{login.name}:x:{login.uid}:{login.uid}:Volt lab login:/home/{login.name}:/bin/bash"
    # "*": no password, yet not locked (sshd without PAM refuses key logins to locked accounts).
    _append_line(etc / "passwd", Path("/etc/passwd"), user_line)
    _append_line(etc / "group", Path("/etc/group"), f"{login.name}:x:{login.uid}:")
    _append_line(etc / "shadow", Path("/etc/shadow"), f"{login.name}:*:20000:0:99999:7:::", mode=0o640)
    (etc / "sudoers.d").mkdir(exist_ok=True)
    sudoers = etc / "sudoers.d" / "volt-lab"
    sudoers.write_text(f"{login.name} ALL=(ALL:ALL) NOPASSWD: ALL\n")
    sudoers.chmod(0o440)
    (etc / "profile.d").mkdir(exist_ok=True)
    (etc / "profile.d" / "volt-lab.sh").write_text(f"export VOLT_HOST_ROOT={TOOLS_ROOT}\n")
    return public


def _append_line(target: Path, original: Path, line: str, mode: int = 0o644) -> None:
    text = original.read_text() if original.exists() else ""
    target.write_text(text + ("" if not text or text.endswith("\n") else "\n") + line + "\n")
    target.chmod(mode)
    if target.name == "shadow":
        shadow_gid = _group_id("shadow")
        if shadow_gid is not None:
            os.chown(target, 0, shadow_gid)


def _group_id(name: str) -> int | None:
    for line in Path("/etc/group").read_text().splitlines():
        parts = line.split(":")
        if parts[0] == name and len(parts) > 2 and parts[2].isdigit():
            return int(parts[2])
    return None


def _sshd_config(machine: Machine, login: LoginUser) -> str:
    return (
        "\n".join(
            [
                f"Port {SSH_PORT}",
                f"ListenAddress {machine.address}",  # its lab address, where the gate reaches it
                "ListenAddress 127.0.0.1",  # its own loopback (of its own network namespace)
                "HostKey /etc/ssh/ssh_host_ed25519_key",
                "PidFile none",
                "AuthorizedKeysFile .ssh/authorized_keys",
                "PermitRootLogin prohibit-password",
                "AuthenticationMethods publickey",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "UseDNS no",
                "PrintMotd no",
                "X11Forwarding no",
                "MaxStartups 100",
                "MaxSessions 100",
                "Subsystem sftp internal-sftp",
                # Where the simulated tools' spec and faults are, for every session (discovery reads
                # ${VOLT_HOST_ROOT}/sys/class/infiniband, as on a sandboxed local host).
                f'SetEnv "VOLT_HOST_ROOT={TOOLS_ROOT}"',
            ]
        )
        + "\n"
    )


def _write_home(home: Path, login: LoginUser) -> None:
    user_home = home / login.name
    ssh = user_home / ".ssh"
    ssh.mkdir(parents=True, exist_ok=True)
    (ssh / "authorized_keys").write_text(login.public_key + "\n")
    (ssh / "authorized_keys").chmod(0o600)
    ssh.chmod(0o700)
    user_home.chmod(0o755)
    for path in (user_home, ssh, ssh / "authorized_keys"):
        os.chown(path, login.uid, login.uid)


def _write_tools(root: Path, machine: Machine, python: str) -> None:
    tools = root / "disk" / "opt" / "volt-lab"
    (tools / "faults").mkdir(parents=True, exist_ok=True)
    (tools / "spec.json").write_text(json.dumps(machine.spec, indent=2))
    for relative, content in sysfs_tree(dict(machine.spec)).items():
        (tools / relative).parent.mkdir(parents=True, exist_ok=True)
        (tools / relative).write_text(content)
    simulator = tools / "simulator"
    for package in _PACKAGES:
        (simulator / package).mkdir(parents=True, exist_ok=True)
        (simulator / package / "__init__.py").write_text("")
    for relative in _SIMULATOR_FILES:
        shutil.copyfile(INVENTORY_DIR / relative, simulator / "inventory" / relative)
    for tool in ("nvidia-smi", "ibstat"):
        script = root / "usr-local-bin" / tool
        script.write_text(
            "#!/bin/sh\n"
            f': "${{VOLT_HOST_ROOT:={TOOLS_ROOT}}}"\n'
            "export VOLT_HOST_ROOT\n"
            f'PYTHONPATH={TOOLS_ROOT}/simulator exec {python} -m inventory.drivers.simulator {tool} "$@"\n'
        )
        script.chmod(0o755)


def _init_script(root: Path, shared: Path, machine: Machine) -> str:
    disk = root / "disk"
    binds = "\n".join(f"mount --bind {disk / sub} {target}" for sub, target in DISKS.items())
    return f"""# PID 1 of lab machine {machine.name}, in its own mount, PID and UTS namespaces: mount, then exec sshd.
set -eu
mount -t proc proc /proc
{binds}
mount -t overlay overlay -o lowerdir=/etc,upperdir={root}/etc,workdir={root}/etc-work /etc
mount -t overlay overlay -o lowerdir=/usr/local/bin,upperdir={root}/usr-local-bin,workdir={root}/usr-local-bin-work /usr/local/bin
mount -t tmpfs -o mode=0755,size=64m tmpfs /run
mkdir -p /run/sshd
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=0755,size=1m tmpfs /mnt
mkdir {SHARED_MOUNT}
mount --bind {shared} {SHARED_MOUNT}
hostname {machine.name}
{_hide_the_box(root)}
echo "machine {machine.name} up: sshd is PID $$"
exec /usr/sbin/sshd -D -e -f /etc/ssh/sshd_config
"""


def _hide_the_box(root: Path) -> str:
    """init's last mounts (after every one that reads the lab's folder): the machine's own /var/lib, then an
    empty tmpfs over the lab's folder where /var/lib did not already hide it."""
    lab = shlex.quote(str(root.parent.parent))
    return "\n".join(
        [
            f"mount --bind {shlex.quote(str(root / 'disk' / 'var-lib'))} /var/lib",
            f"if [ -d {lab} ]; then mount -t tmpfs -o mode=0755,size=1m tmpfs {lab}; fi",
        ]
    )


def _under_own_disk(path: Path) -> bool:
    """Whether a machine would not see the box's `path`: it lies under one of the folders it has its own of."""
    return any(path == Path(target) or path.is_relative_to(target) for target in DISKS.values())


def _control_init(
    root: Path, topology: Topology, machine: Machine, python: str, gate_port: int, script: str
) -> str:
    """A control machine's init: Volt's install and the Python its venv is made from, read-only at their own
    paths where they lie under a folder the machine has its own of (a test run's clone under /tmp, a pyenv
    Python under /root: stashed before those are mounted over); elsewhere the machine sees them as is. And,
    started before sshd (which waits for it), the management network as the root namespace sees it: every
    machine's gate address on this machine's loopback, connected over its own cable (inventory/lab/gate.py)."""
    before, after = [], []
    hidden = [p for p in (VOLT_DIR, Path(sys.base_prefix).resolve()) if p.is_relative_to("/var/lib")]
    if hidden:  # init puts the machine's own /var/lib there last, after these would be back in view
        raise MachineError(
            f"{hidden[0]} lies under /var/lib, which a lab machine has its own of: put it elsewhere"
        )
    paths = [path for path in (VOLT_DIR, Path(sys.base_prefix).resolve()) if _under_own_disk(path)]
    for index, path in enumerate(dict.fromkeys(paths)):
        stash, at = shlex.quote(str(root / f"visible-{index}")), shlex.quote(str(path))
        (root / f"visible-{index}").mkdir(exist_ok=True)
        before += [f"mount --bind {at} {stash}", f"mount -o remount,bind,ro {stash}"]
        after += [f"mkdir -p {at}", f"mount --bind {stash} {at}", f"mount -o remount,bind,ro {at}"]
    routes = " ".join(f"{m.gate}:{gate_port}={m.ssh_target}" for m in topology.machines)
    volt = shlex.quote(str(VOLT_DIR))
    after += [
        f"(cd {volt} && PYTHONPATH={volt} exec {shlex.quote(python)} -m inventory.lab.gate --netns /proc/self/ns/net \\",
        f"    --log /var/tmp/volt-gate.log {routes}) </dev/null >/var/tmp/volt-gate.out 2>&1 &",
        # sshd (the sign that the machine is up) only once its gate serves, or the boot fails saying why
        "for _ in $(seq 150); do grep -q . /var/tmp/volt-gate.out && break; sleep 0.1; done",
        'grep -qx ready /var/tmp/volt-gate.out || { echo "its gate did not start: $(cat /var/tmp/volt-gate.out)"; exit 1; }',
    ]
    proc = "mount -t proc proc /proc\n"
    script = script.replace(proc, proc + "\n".join(before) + "\n", 1)
    named = f"hostname {machine.name}\n"
    return script.replace(named, named + "\n".join(after) + "\n", 1)


# --- power --------------------------------------------------------------------------------------


def power_on(lab_dir: Path, machine: Machine, namespace: str) -> ProcessRef:
    """Start the machine's PID 1 in `namespace`; returns the launcher (`unshare`, PID 1's parent), at once.
    `wait_booted` then waits for sshd."""
    root = machine_dir(lab_dir, machine.name)
    with open(root / "console.log", "ab") as console:
        launcher = subprocess.Popen(
            ["ip", "netns", "exec", namespace, "unshare", "--pid", "--fork", "--mount", "--uts",
             "--propagation", "private", "--kill-child", "--", "/bin/sh", str(root / "init.sh")],
            stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    ref = ProcessRef.of(launcher.pid)
    if ref is None:
        raise MachineError(f"machine {machine.name} did not start: {console_tail(lab_dir, machine.name)}")
    return ref


def console_offset(lab_dir: Path, name: str) -> int:
    try:
        return (machine_dir(lab_dir, name) / "console.log").stat().st_size
    except OSError:
        return 0


def console_tail(lab_dir: Path, name: str, lines: int = 8) -> str:
    try:
        text = (machine_dir(lab_dir, name) / "console.log").read_text(errors="replace")
    except OSError:
        return "(no console log)"
    return " | ".join(text.strip().splitlines()[-lines:])


def wait_booted(lab_dir: Path, machine: Machine, launcher: ProcessRef, offset: int) -> ProcessRef:
    """PID 1 (its PID on this box) once its sshd listens on the machine's address; MachineError if the
    machine stops first or takes longer than BOOT_TIMEOUT_S."""
    log = machine_dir(lab_dir, machine.name) / "console.log"
    ready = f"Server listening on {machine.address} port {SSH_PORT}"
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    while time.monotonic() < deadline:
        pid1 = _child_of(launcher.pid)
        with open(log, errors="replace") as handle:
            handle.seek(offset)
            booted = ready in handle.read()
        if booted and pid1 is not None:
            return pid1
        if not launcher.alive():
            break
        time.sleep(0.05)
    reap(launcher)
    raise MachineError(f"machine {machine.name} did not boot: {console_tail(lab_dir, machine.name)}")


def _child_of(pid: int) -> ProcessRef | None:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and parent_pid(int(entry.name)) == pid:
            return ProcessRef.of(int(entry.name))
    return None


def power_off(pid1: ProcessRef | None, launcher: ProcessRef | None) -> None:
    """Cut the power: SIGKILL PID 1, which ends every process of the machine's PID namespace."""
    for ref in (pid1, launcher):
        kill(ref)
    for ref in (pid1, launcher):
        wait_gone(ref)


def kill(ref: ProcessRef | None, sig: int = signal.SIGKILL) -> None:
    """Signal a process the lab started, by PID, only while it is still that process."""
    if ref is not None and ref.alive():
        try:
            os.kill(ref.pid, sig)
        except ProcessLookupError:
            pass


def wait_gone(ref: ProcessRef | None, timeout_s: float = STOP_TIMEOUT_S) -> bool:
    if ref is None:
        return True
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        reap(ref)
        if start_time(ref.pid) != ref.start:
            return True
        time.sleep(0.05)
    return False


def reap(ref: ProcessRef | None) -> None:
    """Collect the exit of a process this one started (no zombie is left behind); others are not ours."""
    if ref is None:
        return
    try:
        os.waitpid(ref.pid, os.WNOHANG)
    except ChildProcessError:
        pass


def enter_command(pid1: ProcessRef, argv: list[str], user: str | None = None) -> list[str]:
    """`argv` run inside a running machine (all its namespaces), as root or as `user` (a login shell)."""
    prefix = ["nsenter", "--target", str(pid1.pid), "--mount", "--uts", "--net", "--pid", "--"]
    if user is None:
        return prefix + argv
    return prefix + ["su", "--login", user, "--command", shlex.join(argv)]
