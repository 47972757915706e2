"""The `ssh` host driver: real provider hosts over SSH, through asyncssh.

The driver interface is synchronous (Celery tasks and `fan_out` threads call it), asyncssh is
asynchronous. Each driver therefore owns a private event loop running in a daemon thread; calls
are submitted to that loop and waited for. One SSH connection is opened lazily and reused by every
call until `close()`, which closes it and stops the loop (a later call starts both again).

Host keys: with `known_host_key` the server must present exactly that key (its algorithm is the
only one offered during key exchange, so a server with several host keys presents the pinned
one). Without it the first contact trusts any key (TOFU) and `seen_host_key` gives the caller the
key to pin. The key is checked before authentication, so no signature goes to an unverified host.

Pure Python: no Django import.
"""

from __future__ import annotations

import asyncio
import logging
import posixpath
import shlex
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import asyncssh

from .base import (
    AuthenticationRefused,
    CommandResult,
    CommandTimeout,
    DriverError,
    HostDriver,
    HostKeyMismatch,
    HostUnreachable,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Extra seconds the calling thread waits beyond a call's own deadlines before giving up on the loop.
_CALLER_GRACE_S = 10.0
#: How long a timed-out command's channel gets to close after it was signalled.
_KILL_GRACE_S = 2.0


class InvalidKey(DriverError, ValueError):
    """A private key or host key given to the driver could not be read."""

    code = "invalid_key"


def parse_private_key(text: str) -> asyncssh.SSHKey:
    """Read an unencrypted OpenSSH (or PEM) private key; raise InvalidKey with a readable message."""
    try:
        return asyncssh.import_private_key(text.strip() + "\n")
    except (asyncssh.KeyImportError, ValueError, TypeError) as exc:
        raise InvalidKey(
            f"the SSH private key could not be read ({exc}); paste the whole unencrypted key, "
            "from '-----BEGIN OPENSSH PRIVATE KEY-----' to its END line"
        ) from None


def parse_public_key_line(line: str) -> asyncssh.SSHKey:
    """Read a public key line as ssh-keyscan or known_hosts print it: `[host] <type> <base64> [comment]`."""
    fields = line.strip().split()
    for index, field in enumerate(fields[:-1]):
        if field.startswith(("ssh-", "ecdsa-", "sk-")):
            try:
                return asyncssh.import_public_key(f"{field} {fields[index + 1]}")
            except (asyncssh.KeyImportError, ValueError) as exc:
                raise InvalidKey(f"the host key {line.strip()!r} could not be read ({exc})") from None
    raise InvalidKey(
        f"the host key {line.strip()!r} could not be read; give a line such as "
        "'ssh-ed25519 AAAA...' as printed by ssh-keyscan"
    )


def public_key_line(key: asyncssh.SSHKey) -> str:
    """`<type> <base64>`, without comment: the form stored to pin a host."""
    return " ".join(key.export_public_key("openssh").decode().split()[:2])


def fingerprint(key: asyncssh.SSHKey) -> str:
    return key.get_fingerprint("sha256")


class _HostKeyCheck(asyncssh.SSHClient):
    """Records the host key the server presents and accepts it only if it is the pinned one."""

    def __init__(self, driver: SshDriver) -> None:
        self._driver = driver

    def validate_host_public_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        self._driver._presented_host_key = key
        pinned = self._driver._pinned_host_key
        return pinned is None or key == pinned


class SshDriver(HostDriver):
    """One provider host reached over SSH; one reused connection, one private event loop."""

    def __init__(
        self,
        host: str,
        port: int = 22,
        username: str = "root",
        private_key: str | None = None,
        known_host_key: str | None = None,
        connect_timeout: float = 10.0,
        command_timeout: float = 60.0,
    ) -> None:
        self.host = host
        self.port = port
        self.username = username
        self.address = f"{username}@{host}:{port}"
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        self._client_key = parse_private_key(private_key) if private_key is not None else None
        self._pinned_host_key = parse_public_key_line(known_host_key) if known_host_key else None
        self._presented_host_key: asyncssh.SSHKey | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._loop_guard = threading.Lock()
        self._conn: asyncssh.SSHClientConnection | None = None
        self._conn_lock: asyncio.Lock | None = None
        self._forwards: dict[tuple[str, int], tuple[asyncssh.SSHClientConnection, int]] = {}

    def __repr__(self) -> str:
        return f"<SshDriver {self.address}>"

    @property
    def seen_host_key(self) -> str | None:
        """The host key the server presented on the last connection, as `<type> <base64>`."""
        key = self._presented_host_key
        return public_key_line(key) if key is not None else None

    # -- the HostDriver interface ---------------------------------------------------------------

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        limit = self.command_timeout if timeout is None else timeout
        return self._call(lambda: self._run(command, limit), self.connect_timeout + limit, command)

    def copy_file(self, local_path: Path, remote_path: str, timeout: float | None = None) -> None:
        limit = self.command_timeout if timeout is None else timeout
        what = f"copy of {local_path} to {remote_path}"
        self._call(
            lambda: self._copy(Path(local_path), remote_path, limit), self.connect_timeout + limit, what
        )

    def check_reachable(self, timeout: float | None = None) -> None:
        limit = self.connect_timeout if timeout is None else timeout
        result = self.run("true", timeout=limit)
        if not result.ok:
            raise DriverError(f"{self.address} accepted the connection but could not run a command: {result}")

    def forward(self, target_host: str, target_port: int, timeout: float | None = None) -> int:
        """A port on this machine's 127.0.0.1 that reaches `target_host:target_port` as the host sees it,
        through this driver's SSH connection (a local forward, what `ssh -L` and Ray's own `ray dashboard`
        do): how Volt reaches a head's dashboard on a host that opens SSH alone. The forward lives as
        long as the connection; asked again after the connection dropped, a new one is made."""
        limit = self.connect_timeout if timeout is None else timeout
        what = f"forward to {target_host}:{target_port}"
        return self._call(lambda: self._forward(target_host, target_port), self.connect_timeout + limit, what)

    def close(self) -> None:
        with self._loop_guard:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        if thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(self._disconnect(), loop).result(timeout=_CALLER_GRACE_S)
            except Exception:  # noqa: BLE001 - closing must not fail; the loop goes away regardless
                logger.debug("closing the connection to %s failed", self.address, exc_info=True)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=_CALLER_GRACE_S)
        if not thread.is_alive():
            loop.close()

    # -- the event loop thread ------------------------------------------------------------------

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._loop_guard:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=self._serve_loop, args=(loop,), name=f"ssh-{self.address}", daemon=True
                )
                thread.start()
                self._loop, self._thread, self._conn, self._conn_lock = loop, thread, None, None
            return self._loop

    @staticmethod
    def _serve_loop(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        loop.run_forever()

    def _call(self, make_coro: Callable[[], Awaitable[T]], deadline_s: float, what: str) -> T:
        """Run a coroutine on the driver's loop and wait for it, never longer than its deadline."""
        future = asyncio.run_coroutine_threadsafe(make_coro(), self._ensure_loop())
        try:
            return future.result(timeout=deadline_s + _CALLER_GRACE_S)
        except TimeoutError:
            future.cancel()
            raise CommandTimeout(
                f"{what!r} on {self.address} did not finish within {deadline_s:g} s"
            ) from None

    # -- coroutines, run on the driver's loop ---------------------------------------------------

    async def _connection(self) -> asyncssh.SSHClientConnection:
        if self._conn_lock is None:
            self._conn_lock = asyncio.Lock()
        async with self._conn_lock:
            if self._conn is None or self._conn.is_closed():
                self._conn = await self._connect()
            return self._conn

    async def _connect(self) -> asyncssh.SSHClientConnection:
        try:
            return await self._open_connection(only_pinned_key_type=True)
        except (ConnectionResetError, BrokenPipeError, asyncssh.ConnectionLost):
            if self._pinned_host_key is None or self._presented_host_key is not None:
                raise self._unreachable_after_handshake_drop() from None
        # OpenSSH hangs up without a word when it has no host key of the one type we offered.
        # Ask again offering every type: the key it shows is rejected before authentication, and
        # the mismatch message can name it.
        try:
            return await self._open_connection(only_pinned_key_type=False)
        except (ConnectionResetError, BrokenPipeError, asyncssh.ConnectionLost):
            raise self._unreachable_after_handshake_drop() from None

    async def _open_connection(self, only_pinned_key_type: bool) -> asyncssh.SSHClientConnection:
        """Connect and authenticate; map failures to driver errors, except a connection dropped mid-way."""
        options: dict = {}
        if self._client_key is not None:
            options.update(client_keys=[self._client_key], agent_path=None)
        if self._pinned_host_key is not None and only_pinned_key_type:
            options["server_host_key_algs"] = [alg.decode() for alg in self._pinned_host_key.sig_algorithms]
        self._presented_host_key = None
        try:
            return await asyncssh.connect(
                self.host,
                self.port,
                username=self.username,
                # Empty trusted lists (rather than None) route every key through _HostKeyCheck.
                known_hosts=([], [], []),
                client_factory=lambda: _HostKeyCheck(self),
                config=[],
                preferred_auth="publickey",
                password=None,
                kbdint_auth=False,
                # Both bound the handshake: connect_timeout from the TCP connect on (a port that accepts and
                # never sends a banner), login_timeout (asyncssh's default: 2 minutes) after it.
                connect_timeout=self.connect_timeout,
                login_timeout=self.connect_timeout,
                keepalive_interval=30,
                keepalive_count_max=3,
                **options,
            )
        except asyncssh.PermissionDenied:
            raise AuthenticationRefused(
                f"{self.address} refused the SSH key for user {self.username!r}; add the public key to "
                f"~{self.username}/.ssh/authorized_keys on the host"
            ) from None
        except asyncssh.HostKeyNotVerifiable:
            raise self._host_key_mismatch() from None
        except asyncssh.KeyExchangeFailed as exc:
            if self._pinned_host_key is not None and "host key" in str(exc).lower():
                raise self._host_key_mismatch() from None
            raise DriverError(f"SSH key exchange with {self.address} failed: {exc}") from None
        except (ConnectionResetError, BrokenPipeError, asyncssh.ConnectionLost):
            raise
        except (OSError, TimeoutError) as exc:
            raise self._unreachable(exc) from None
        except asyncssh.ProtocolError:  # something answered, but not with an SSH banner
            raise self._unreachable(None) from None
        except asyncssh.Error as exc:
            raise DriverError(f"SSH connection to {self.address} failed: {exc.reason}") from None

    def _unreachable_after_handshake_drop(self) -> HostUnreachable:
        return self._unreachable(None)

    def _host_key_mismatch(self) -> HostKeyMismatch:
        pinned, presented = self._pinned_host_key, self._presented_host_key
        expected = f"{pinned.get_algorithm()} {fingerprint(pinned)}" if pinned else "a trusted key"
        if presented is None:
            shown = "offered no host key of that type"
        else:
            shown = f"presented {presented.get_algorithm()} {fingerprint(presented)}"
        return HostKeyMismatch(
            f"{self.address} {shown}, but the pinned host key is {expected}. The host may have been "
            "reinstalled, or someone is intercepting the connection: check the key on the host "
            "(ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub) and update the pinned key only if it "
            "really changed"
        )

    def _unreachable(self, exc: BaseException | None) -> HostUnreachable:
        """One message for every way of not reaching an SSH server before its handshake.

        Whether the port was closed, filtered, or open with something else behind it, or the name did
        not resolve, is deliberately not said: onboarding an address would otherwise scan ports and
        names on the worker's network (issue 9). The cause goes to the worker's log only.
        """
        logger.info("no SSH server reached at %s: %r", self.address, exc)
        return HostUnreachable(
            f"{self.host} is not answering as an SSH server on port {self.port} (nothing reachable "
            "there, or not an SSH server); check the address, port and firewall"
        )

    async def _open_process(self, command: str) -> asyncssh.SSHClientProcess:
        conn = await self._connection()
        try:
            return await conn.create_process(command, encoding="utf-8", errors="replace")
        except (asyncssh.ChannelOpenError, asyncssh.ConnectionLost, BrokenPipeError, ConnectionError):
            # The command never started: a dead reused connection; open a fresh one and try once more.
            self._conn = None
            conn.abort()
            conn = await self._connection()
            return await conn.create_process(command, encoding="utf-8", errors="replace")

    async def _run(self, command: str, timeout_s: float) -> CommandResult:
        # The session's shell is its process group leader (sshd calls setsid): print its PID first
        # so a timed-out command can be killed with all its children. `eval` keeps the command in
        # the login shell sshd started, with the environment its rc files set up.
        try:
            process = await self._open_process(f"echo $$; eval {shlex.quote(command)}")
        except asyncssh.Error as exc:
            raise DriverError(f"{self.address} could not start {command!r}: {exc.reason}") from None
        process.stdin.write_eof()
        session_pid: int | None = None
        try:
            async with asyncio.timeout(timeout_s):
                first_line = await process.stdout.readline()
                session_pid = int(first_line) if first_line.strip().isdigit() else None
                done = await process.wait()
        except TimeoutError:
            await self._stop(process, session_pid)
            raise CommandTimeout(
                f"{command!r} on {self.address} did not finish within {timeout_s:g} s and was stopped"
            ) from None
        except (asyncssh.ConnectionLost, asyncssh.DisconnectError, ConnectionError) as exc:
            raise self._lost_during(command, str(exc)) from None
        if done.returncode is None:  # the channel closed without an exit status
            raise self._lost_during(command, "no exit status came back")
        stdout = done.stdout or ""
        if session_pid is None:  # not a POSIX shell: what came first was the command's own output
            stdout = first_line + stdout
        # A negative returncode is a signal number; report it as a shell would (128 + N).
        exit_status = done.returncode if done.returncode >= 0 else 128 - done.returncode
        return CommandResult(exit_status=exit_status, stdout=stdout, stderr=done.stderr or "")

    def _lost_during(self, command: str, reason: str) -> HostUnreachable:
        return HostUnreachable(
            f"the connection to {self.address} was lost while running {command!r} ({reason}); "
            "check that the host is up and the network between us"
        )

    async def _stop(self, process: asyncssh.SSHClientProcess, session_pid: int | None) -> None:
        """Kill a timed-out command's process group and close its channel, keeping the connection usable.

        sshd holds a session channel open until its command exits, and refuses `signal` requests
        for root sessions, so the group is killed from a second channel. Processes that left the
        group on purpose (setsid, e.g. `ray start`) are not touched.
        """
        if session_pid is not None and self._conn is not None:
            try:
                await self._conn.run(f"kill -KILL -- -{session_pid}", timeout=_KILL_GRACE_S)
            except (asyncssh.Error, OSError, TimeoutError):
                logger.warning("could not kill timed-out session %s on %s", session_pid, self.address)
        else:
            try:
                process.send_signal("KILL")
            except OSError:
                pass
        process.close()
        try:
            await asyncio.wait_for(process.wait_closed(), _KILL_GRACE_S)
        except TimeoutError:
            logger.warning("a timed-out command on %s kept its channel open", self.address)

    async def _copy(self, local_path: Path, remote_path: str, timeout_s: float) -> None:
        if not local_path.is_file():
            raise FileNotFoundError(f"{local_path} is not a file")
        conn = await self._connection()
        try:
            await asyncio.wait_for(self._sftp_put(conn, local_path, remote_path), timeout_s)
        except TimeoutError:
            raise CommandTimeout(
                f"copying {local_path} to {remote_path} on {self.address} took longer than {timeout_s:g} s"
            ) from None
        except (asyncssh.SFTPError, asyncssh.ChannelOpenError) as exc:
            raise DriverError(
                f"copying {local_path} to {remote_path} on {self.address} failed: {exc.reason}"
            ) from None

    @staticmethod
    async def _sftp_put(conn: asyncssh.SSHClientConnection, local_path: Path, remote_path: str) -> None:
        async with conn.start_sftp_client() as sftp:
            parent = posixpath.dirname(remote_path)
            if parent:
                await sftp.makedirs(parent, exist_ok=True)
            await sftp.put(str(local_path), remote_path)
            # Scripts must stay executable; the remote umask is not the local one.
            await sftp.chmod(remote_path, local_path.stat().st_mode & 0o777)

    async def _forward(self, target_host: str, target_port: int) -> int:
        conn = await self._connection()
        known = self._forwards.get((target_host, target_port))
        if known is not None and known[0] is conn:
            return known[1]
        try:
            await self._check_forwarding(conn, target_host, target_port)
            listener = await conn.forward_local_port("127.0.0.1", 0, target_host, target_port)
        except (OSError, asyncssh.Error) as exc:
            raise DriverError(
                f"{self.address} would not forward to {target_host}:{target_port}: {exc}; the host's sshd "
                "must allow TCP forwarding (AllowTcpForwarding yes, OpenSSH's default)"
            ) from None
        self._forwards[(target_host, target_port)] = (conn, listener.get_port())
        return listener.get_port()

    @staticmethod
    async def _check_forwarding(
        conn: asyncssh.SSHClientConnection, target_host: str, target_port: int
    ) -> None:
        """A local listener is made without asking the server anything: ask once, so a host whose sshd
        refuses forwarding says so now, not as every later request reset. Nothing listening there yet
        (a head still starting) is no refusal."""
        try:
            _, writer = await conn.open_connection(target_host, target_port)
        except asyncssh.ChannelOpenError as exc:
            if exc.code == asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED:
                raise
            return
        writer.close()

    async def _disconnect(self) -> None:
        self._forwards.clear()
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
            try:
                await asyncio.wait_for(conn.wait_closed(), _KILL_GRACE_S)
            except TimeoutError:
                conn.abort()
