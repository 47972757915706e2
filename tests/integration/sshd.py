"""A real OpenSSH server on 127.0.0.1 for integration tests.

`start_sshd()` writes a private sshd_config into a folder (fresh ed25519 host key, fresh client key
in its own authorized_keys, key-only login), runs `/usr/sbin/sshd -D -e -f <config>` on a free
loopback port and waits until it greets. `SetEnv` injects environment variables into every
session, so a test can put a sandbox `bin/` first on the remote PATH. Keys come from asyncssh, so
nothing beyond openssh-server is needed.

sshd honours only the first `SetEnv` line, so every variable goes on that one line. The user's
shell still reads its rc files (bash sources ~/.bashrc under sshd), which may prepend to PATH.
"""

from __future__ import annotations

import getpass
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import asyncssh

SSHD_BINARY = Path("/usr/sbin/sshd")
PRIVSEP_DIR = Path("/run/sshd")
LOOPBACK = "127.0.0.1"
STARTUP_TIMEOUT_S = 10.0
STOP_GRACE_S = 5.0


class SshdUnavailable(RuntimeError):
    """sshd is missing or would not start; the message says how to fix it."""


@dataclass
class SshdServer:
    """A running sshd and the credentials that log in to it."""

    host: str
    port: int
    username: str
    client_private_key: str  # OpenSSH text
    client_public_key: str  # "ssh-ed25519 AAAA..."
    host_public_key: str  # "ssh-ed25519 AAAA...", as ssh-keyscan prints it (without the host name)
    pid: int
    workdir: Path
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        return f"{self.username}@{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "sshd.log"

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM this sshd by its PID, SIGKILL it if it lingers. Safe to call twice."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=STOP_GRACE_S)


def _key_pair() -> tuple[str, str]:
    key = asyncssh.generate_private_key("ssh-ed25519")
    private_text = key.export_private_key("openssh").decode()
    public_line = " ".join(key.export_public_key("openssh").decode().split()[:2])
    return private_text, public_line


def _free_port(listen: str = LOOPBACK) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((listen, 0))
        return sock.getsockname()[1]


def _setenv_word(name: str, value: str) -> str:
    if not name.replace("_", "").isalnum() or any(ch in value for ch in '"\n\r'):
        raise ValueError(f"cannot pass {name}={value!r} through sshd's SetEnv")
    return f'"{name}={value}"'


def _config(
    workdir: Path, port: int, username: str, env: dict[str, str], listen: str = LOOPBACK, extra: tuple = ()
) -> str:
    lines = [
        f"ListenAddress {listen}",
        f"Port {port}",
        f"HostKey {workdir / 'host_ed25519_key'}",
        f"PidFile {workdir / 'sshd.pid'}",
        f"AuthorizedKeysFile {workdir / 'authorized_keys'}",
        f"AllowUsers {username}",
        "PermitRootLogin prohibit-password",
        "AuthenticationMethods publickey",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",
        "UseDNS no",
        "PrintMotd no",
        "X11Forwarding no",
        # Tests open many connections at once (fan_out); the defaults start dropping at 10.
        "MaxStartups 100",
        "MaxSessions 100",
        # A session's HOME may be a sandbox (SetEnv); file copies with relative paths must land there
        # too, as on a real host where both are the user's home (else they went to /root).
        "Subsystem sftp internal-sftp" + (f" -d {env['HOME']}" if env and env.get("HOME") else ""),
    ]
    lines += list(extra)  # e.g. "AllowTcpForwarding no"
    if env:  # sshd keeps only the first SetEnv line: all variables go on one
        lines.append("SetEnv " + " ".join(_setenv_word(name, value) for name, value in env.items()))
    return "\n".join(lines) + "\n"


def _require_sshd() -> None:
    if not SSHD_BINARY.is_file():
        raise SshdUnavailable(
            f"{SSHD_BINARY} is missing: the SSH integration tests need a real OpenSSH server; "
            "install it with `apt-get install -y openssh-server`"
        )
    # Privilege separation needs its empty, root-owned directory.
    PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)


def _wait_for_greeting(server: SshdServer, deadline: float) -> bool:
    """True once sshd answers with its SSH banner; False if the process died first."""
    while time.monotonic() < deadline:
        if server.process is not None and server.process.poll() is not None:
            return False
        try:
            with socket.create_connection((server.host, server.port), timeout=1.0) as sock:
                if sock.recv(64).startswith(b"SSH-"):
                    return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


def start_sshd(
    workdir: Path, env: dict[str, str] | None = None, listen: str = LOOPBACK, extra: tuple = ()
) -> SshdServer:
    """Start sshd on a free port of loopback address `listen`, serving the current user with a fresh client key."""
    if not listen.startswith("127."):
        raise ValueError(f"{listen}: test servers bind to loopback addresses only")
    _require_sshd()
    workdir.mkdir(parents=True, exist_ok=True)
    env = dict(env or {})
    username = getpass.getuser()
    host_private, host_public = _key_pair()
    client_private, client_public = _key_pair()
    host_key_path = workdir / "host_ed25519_key"
    host_key_path.write_text(host_private)
    host_key_path.chmod(0o600)  # sshd refuses host keys others can read
    (workdir / "authorized_keys").write_text(client_public + "\n")

    failure = ""
    for _attempt in range(3):  # another process may take the free port before sshd binds it
        port = _free_port(listen)
        config_path = workdir / "sshd_config"
        config_path.write_text(_config(workdir, port, username, env, listen, extra))
        with open(workdir / "sshd.log", "ab") as log:
            process = subprocess.Popen(
                [str(SSHD_BINARY), "-D", "-e", "-f", str(config_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                close_fds=True,
            )
        server = SshdServer(
            host=listen,
            port=port,
            username=username,
            client_private_key=client_private,
            client_public_key=client_public,
            host_public_key=host_public,
            pid=process.pid,
            workdir=workdir,
            env=env,
            process=process,
        )
        if _wait_for_greeting(server, time.monotonic() + STARTUP_TIMEOUT_S):
            return server
        server.stop()
        failure = server.log_tail()
        if "Address already in use" not in failure:
            break
    raise SshdUnavailable(f"sshd did not start (config {workdir / 'sshd_config'}):\n{failure}")


def environment_for(*, path_first: os.PathLike | str | None = None, **extra: str) -> dict[str, str]:
    """SetEnv values that put `path_first` ahead of the system PATH, plus any extra variables."""
    env = dict(extra)
    if path_first is not None:
        env["PATH"] = f"{path_first}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    return env
