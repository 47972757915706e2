"""The `ssh` host driver against a real OpenSSH server on 127.0.0.1."""

from __future__ import annotations

import socket
import threading
import time

import asyncssh
import pytest

from inventory.drivers.base import (
    AuthenticationRefused,
    CommandTimeout,
    DriverError,
    HostKeyMismatch,
    HostUnreachable,
    fan_out,
)
from inventory.drivers.ssh import InvalidKey, SshDriver, fingerprint, parse_public_key_line

pytestmark = pytest.mark.integration


def driver_for(server, **overrides) -> SshDriver:
    options = dict(
        host=server.host,
        port=server.port,
        username=server.username,
        private_key=server.client_private_key,
        known_host_key=server.host_public_key,
        connect_timeout=5.0,
    )
    options.update(overrides)
    return SshDriver(**options)


@pytest.fixture
def driver(sshd):
    with driver_for(sshd) as drv:
        yield drv


def new_key_text(algorithm: str = "ssh-ed25519") -> str:
    return asyncssh.generate_private_key(algorithm).export_private_key("openssh").decode()


def public_line_of(private_text: str) -> str:
    key = asyncssh.import_private_key(private_text)
    return " ".join(key.export_public_key("openssh").decode().split()[:2])


def test_run_returns_stdout_stderr_and_exit_status(driver, sshd):
    result = driver.run("echo hello; echo warning >&2; whoami")

    assert result.ok
    assert result.stdout == f"hello\n{sshd.username}\n"
    assert result.stderr == "warning\n"
    assert driver.address == f"{sshd.username}@127.0.0.1:{sshd.port}"


def test_non_zero_exit_is_returned_not_raised(driver):
    result = driver.run("echo partial; exit 7")

    assert result.exit_status == 7
    assert not result.ok
    assert result.stdout == "partial\n"


def test_command_killed_by_a_signal_reports_128_plus_signal(driver):
    assert driver.run("kill -TERM $$").exit_status == 143


def test_environment_set_by_the_server_reaches_commands(sshd_factory, tmp_path):
    sandbox = tmp_path / "host"
    (sandbox / "bin").mkdir(parents=True)
    tool = sandbox / "bin" / "volt-fake-tool"
    tool.write_text('#!/bin/sh\necho "fake tool under $VOLT_HOST_ROOT"\n')
    tool.chmod(0o755)
    server = sshd_factory({"PATH": f"{sandbox}/bin:/usr/bin:/bin", "VOLT_HOST_ROOT": str(sandbox)})

    with driver_for(server) as drv:
        result = drv.run("volt-fake-tool; command -v volt-fake-tool")

    assert result.ok, result
    assert result.stdout == f"fake tool under {sandbox}\n{tool}\n"


def test_copy_file_creates_parent_directories_and_keeps_mode(driver, tmp_path):
    script = tmp_path / "probe.sh"
    script.write_text("#!/bin/sh\necho probe ran with $# args\n")
    script.chmod(0o755)
    remote = tmp_path / "remote" / "deep" / "er" / "probe.sh"

    driver.copy_file(script, str(remote))

    assert driver.run(f"cat {remote}").stdout == script.read_text()
    assert driver.run(f"{remote} a b").stdout == "probe ran with 2 args\n"


def _failure_message(port: int) -> HostUnreachable:
    drv = SshDriver("127.0.0.1", port, private_key=new_key_text(), connect_timeout=2.0)
    try:
        with pytest.raises(HostUnreachable) as caught:
            drv.check_reachable()
    finally:
        drv.close()
    return caught.value


def _serve_once(reply: bytes | None) -> tuple[socket.socket, threading.Thread]:
    """A listener that answers its first connection with `reply` and hangs up (None: stays silent)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            if reply is None:
                time.sleep(4)
            else:
                conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread


def test_connection_errors_do_not_tell_closed_from_open_ports():
    """Issue 9: onboarding must not make the worker a port scanner. A closed port, a web server and a
    silent service all give one message, which says no more than 'not an SSH server'."""
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    failures = {"closed": (_failure_message(closed), closed)}
    replies = {"http": b"HTTP/1.1 400 Bad Request\r\nServer: nginx\r\n\r\n", "silent": None}
    for name, reply in replies.items():
        listener, thread = _serve_once(reply)
        with listener:
            port = listener.getsockname()[1]
            failures[name] = (_failure_message(port), port)
            thread.join(timeout=10)

    assert all(exc.code == "unreachable" for exc, _ in failures.values())
    texts = {name: str(exc).replace(f"port {port}", "port N") for name, (exc, port) in failures.items()}
    assert len(set(texts.values())) == 1, texts
    message = texts["closed"]
    assert "not an SSH server" in message and "firewall" in message
    for revealing in ("refused", "nginx", "HTTP", "banner", "within", "reset", "closed"):
        assert revealing not in message


def test_wrong_client_key_is_refused(sshd):
    with driver_for(sshd, private_key=new_key_text()) as drv:
        with pytest.raises(AuthenticationRefused) as caught:
            drv.run("true")

    assert repr(sshd.username) in str(caught.value)
    assert "authorized_keys" in str(caught.value)


def test_wrong_pinned_host_key_is_a_mismatch(sshd):
    impostor = public_line_of(new_key_text())

    with driver_for(sshd, known_host_key=impostor) as drv:
        with pytest.raises(HostKeyMismatch) as caught:
            drv.run("true")

    message = str(caught.value)
    assert fingerprint(parse_public_key_line(impostor)) in message  # expected
    assert fingerprint(parse_public_key_line(sshd.host_public_key)) in message  # presented
    assert drv.seen_host_key == sshd.host_public_key


def test_pinned_key_of_another_type_is_a_mismatch(sshd):
    rsa_line = public_line_of(new_key_text("ssh-rsa"))

    with driver_for(sshd, known_host_key=rsa_line) as drv:
        with pytest.raises(HostKeyMismatch, match="ssh-rsa"):
            drv.run("true")


def test_pinned_key_line_may_carry_the_host_name_as_keyscan_prints_it(sshd):
    with driver_for(sshd, known_host_key=f"[127.0.0.1]:{sshd.port} {sshd.host_public_key}") as drv:
        drv.check_reachable()


def test_first_contact_trusts_and_records_the_host_key(sshd):
    with driver_for(sshd, known_host_key=None) as drv:
        assert drv.seen_host_key is None
        drv.check_reachable()

        assert drv.seen_host_key == sshd.host_public_key


def test_command_past_its_timeout_is_stopped_with_its_children(driver, tmp_path):
    started = time.monotonic()
    with pytest.raises(CommandTimeout):
        driver.run(
            f"echo $$ > {tmp_path}/shell.pid; sleep 30 & echo $! > {tmp_path}/child.pid; wait", timeout=1
        )
    assert time.monotonic() - started < 5

    # The connection is not stuck, and neither the shell nor its child survived.
    pids = driver.run(f"cat {tmp_path}/shell.pid {tmp_path}/child.pid").stdout.split()
    assert len(pids) == 2
    alive_check = " ".join(f"ps -o stat= -p {pid} | grep -v Z;" for pid in pids)  # zombies are dead
    deadline = time.monotonic() + 3
    while (alive := driver.run(alive_check).stdout.strip()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert alive == ""


def test_fan_out_runs_drivers_at_the_same_time(sshd):
    drivers = [driver_for(sshd) for _ in range(4)]
    try:
        assert fan_out(drivers, lambda drv: drv.check_reachable()) == [None] * 4  # connect first

        results = fan_out(drivers, lambda drv: drv.run("date +%s.%N; sleep 1; date +%s.%N"))
    finally:
        for drv in drivers:
            drv.close()

    intervals = [tuple(float(stamp) for stamp in result.stdout.split()) for result in results]
    assert len(intervals) == 4
    latest_start = max(start for start, _ in intervals)
    earliest_end = min(end for _, end in intervals)
    assert latest_start < earliest_end, f"the four commands never ran at once: {intervals}"


def test_close_twice_is_harmless_and_the_driver_reconnects_after(driver):
    assert driver.run("echo one").stdout == "one\n"
    driver.close()
    driver.close()

    assert driver.run("echo two").stdout == "two\n"


def test_private_key_that_is_not_a_key_is_rejected_clearly():
    with pytest.raises(InvalidKey, match="private key could not be read") as caught:
        SshDriver("127.0.0.1", private_key="-----BEGIN OPENSSH PRIVATE KEY-----\nnot a key\n")

    assert isinstance(caught.value, ValueError)


def test_unreadable_host_key_line_is_rejected_clearly():
    with pytest.raises(InvalidKey, match="ssh-keyscan"):
        SshDriver("127.0.0.1", private_key=new_key_text(), known_host_key="not-a-key")


def test_a_forward_reaches_a_port_as_the_host_sees_it_and_is_made_again_after_a_drop(driver, sshd):
    """How Volt reaches a cluster head's dashboard on a host that opens SSH alone (inventory/tunnels.py)."""

    def banner(port: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
            return conn.recv(64)

    port = driver.forward(sshd.host, sshd.port)  # the host's own sshd, reached through the forward
    assert banner(port).startswith(b"SSH-2.0-")
    assert driver.forward(sshd.host, sshd.port) == port  # one listener per target and connection
    driver.close()  # the connection (and its listener) gone: asked again, a new one is made
    again = driver.forward(sshd.host, sshd.port)
    assert banner(again).startswith(b"SSH-2.0-")


def test_a_host_whose_sshd_refuses_forwarding_says_so_at_once(sshd_factory):
    server = sshd_factory(extra=("AllowTcpForwarding no",))
    with driver_for(server) as drv, pytest.raises(DriverError, match="AllowTcpForwarding yes"):
        drv.forward(server.host, server.port)
