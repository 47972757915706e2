"""The real demo command, as a new user runs it: start, use it through the `volt` CLI, Ctrl-C, nothing left.

Runs `manage.py demo` (what `scripts/demo` execs once .venv is installed) in a fresh data dir with an
embedded Redis (REDIS_URL points at a port nothing listens on), so it shares nothing with other runs.
Every wait is bounded; the whole test takes a few minutes on a loaded 2-core machine.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from voltweb import namespace

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 240
CLUSTER_TIMEOUT_S = 300
STOP_TIMEOUT_S = 150


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def demo_env(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    # Nothing answers there: the demo starts its embedded Redis, as on a machine without one.
    env.update(VOLT_DATA_DIR=str(data_dir), REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")
    env.update(PYTHONUNBUFFERED="1", VOLT_PROBE_MAX_MB="8", VOLT_PROBE_ITERS="3")
    return env


class Demo:
    """`manage.py demo` in its own process group (a terminal's Ctrl-C goes to the foreground group)."""

    def __init__(self, data_dir: Path, *args: str):
        self.data_dir = data_dir
        self.env = demo_env(data_dir)
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "demo", *args],
            cwd=REPO,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)

    def wait_for(self, text: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            self.output.append(line)
            if text in line:
                return
        pytest.fail(f"no {text!r} within {timeout_s} s; output:\n{''.join(self.output)[-4000:]}")

    def drain(self) -> str:
        while not self.lines.empty():
            self.output.append(self.lines.get())
        return "".join(self.output)

    def manage(self, *args: str) -> str:
        return subprocess.run(
            [sys.executable, "manage.py", *args], cwd=REPO, env=self.env, capture_output=True, text=True,
            timeout=120, check=True,
        ).stdout.strip()  # fmt: skip

    def kill(self) -> None:
        """Whatever happened, leave nothing behind (a failed test must not leak Ray nodes)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for pid in processes_of(self.data_dir):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def volt(demo: Demo, port: int, token: str, *args: str, timeout_s: float = CLUSTER_TIMEOUT_S):
    env = dict(os.environ, VOLT_URL=f"http://127.0.0.1:{port}", VOLT_TOKEN=token, VOLT_POLL_INTERVAL="1")
    run = subprocess.run(
        [sys.executable, str(REPO / "voltweb" / "cli.py"), *args],
        env=env, capture_output=True, text=True, timeout=timeout_s + 30,
    )  # fmt: skip
    assert run.returncode == 0, f"volt {' '.join(args)} exited {run.returncode}: {run.stderr[-2000:]}"
    return json.loads(run.stdout)


def processes_of(data_dir: Path) -> dict[int, str]:
    """PID -> command line of every process of this demo, found the ways `ps` and /proc allow: its
    environment names the data dir (web, worker, beat) or carries its install's Ray node marker, or it
    works in (cwd) or writes into (open files) the data dir or the install's Ray temp folder. The latter
    find the Ray agents and workers that overwrite their environment with their process title, and Redis.
    """
    ray_marker = f"VOLT_RAY_NODE=volt-{namespace.install_id(data_dir)}-".encode()
    data_marker = f"VOLT_DATA_DIR={data_dir}".encode()
    places = (str(data_dir.resolve()) + "/", namespace.ray_temp_root(data_dir) + "/")
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            links = [entry / "cwd", *(entry / "fd").iterdir()]
        except OSError:
            continue
        targets = []
        for link in links:
            try:
                targets.append(os.readlink(link) + "/")
            except OSError:
                pass
        if any(item.startswith(ray_marker) or item == data_marker for item in environ) or any(
            target.startswith(places) for target in targets
        ):
            found[int(entry.name)] = cmdline
    return found


def alive_per_ps(pids) -> set[int]:
    """The PIDs among `pids` that `ps` lists, zombies excluded (they are dead, awaiting their parent)."""
    out = subprocess.run(["ps", "-eo", "pid=,stat="], capture_output=True, text=True, check=True).stdout
    listed = {
        int(pid) for pid, stat in (line.split() for line in out.splitlines()) if not stat.startswith("Z")
    }
    return listed & set(pids)


def test_demo_refuses_a_taken_port_with_exit_1_and_suggests_another(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        demo = Demo(tmp_path / "data", "--port", str(port), "--no-seed")
        try:
            assert demo.proc.wait(timeout=120) == 1
        finally:
            demo.kill()
    output = demo.drain()
    assert f"Port {port}" in output and "--port" in output and "Volt is running" not in output
    assert not processes_of(tmp_path / "data")


def test_the_terminal_keeps_to_what_a_person_needs_and_the_log_file_has_the_rest(tmp_path):
    """Issue 24.6: one INFO line per periodic task (4,874 lines in 19 minutes) scrolled the banner and the
    logins away within seconds. The web server's, workers' and beat's lines go to a log file the banner
    names; the terminal keeps the start, the banner, cluster changes, errors and the stop."""
    data_dir = tmp_path / "data"
    demo = Demo(data_dir, "--port", str(free_port()), "--no-seed", "--exit-after", "25")
    try:
        assert demo.proc.wait(timeout=START_TIMEOUT_S) == 0
    finally:
        demo.kill()
    output = demo.drain()
    log = data_dir / "demo.log"
    assert "Volt is running" in output and "Demo stopped." in output
    assert f"Log of the web server, workers and beat: {log}" in output, output
    for chatter in ("Sending due task", "succeeded in", " received", "INFO", "SecurityWarning"):
        assert chatter not in output, f"{chatter!r} on the terminal:\n{output}"
    assert len(output.splitlines()) < 30, output
    text = log.read_text()
    assert "beat | " in text and "Sending due task" in text  # beat's lines, named
    assert "worker | " in text and "succeeded in" in text  # the workers' task lines
    assert "Volt is running" in text  # the terminal's lines too, in order with the rest
    assert log.stat().st_mode & 0o777 == 0o600


def test_ctrl_c_stops_every_process_the_demo_started_ray_nodes_included(tmp_path):
    data_dir = tmp_path / "data"
    port = free_port()
    demo = Demo(data_dir, "--port", str(port))
    try:
        demo.wait_for("Volt is running", START_TIMEOUT_S)
        token = demo.manage("create_api_token", "alice")

        # What CI does with `volt`: create and wait for READY, read it, read its timeline, tear it down.
        first = volt(demo, port, token, "clusters", "create", "--name", "ci-one", "--nodes", "1",
                     "--gpu", "A100:8", "--wait", "--timeout", str(CLUSTER_TIMEOUT_S))  # fmt: skip
        assert first["status"] == "ready" and first["connection"]["ray_address"], first
        got = volt(demo, port, token, "clusters", "get", str(first["id"]))
        assert got["status"] == "ready" and len(got["nodes"]) == 1
        events = volt(demo, port, token, "clusters", "events", str(first["id"]))
        assert [e["to_status"] for e in events][-1] == "ready"
        ended = volt(demo, port, token, "clusters", "terminate", str(first["id"]), "--wait")
        assert ended["status"] == "terminated"
        # Terminating (the worker's teardown, not the demo's exit) left no Ray process: it was the only cluster.
        left_by_terminate = {pid: cmd for pid, cmd in processes_of(data_dir).items() if "ray" in cmd}
        assert not left_by_terminate, left_by_terminate

        # A 2-node cluster left READY when the user presses Ctrl-C.
        second = volt(demo, port, token, "clusters", "create", "--name", "left-running", "--nodes", "2",
                      "--gpu", "H100:8", "--wait", "--timeout", str(CLUSTER_TIMEOUT_S))  # fmt: skip
        assert second["status"] == "ready", second
        before = processes_of(data_dir)
        ray = {
            pid: cmd for pid, cmd in before.items() if "ray" in cmd or "raylet" in cmd or "gcs_server" in cmd
        }
        assert len(ray) >= 4, before  # two nodes: raylets, GCS, dashboard, workers ...

        os.killpg(demo.proc.pid, signal.SIGINT)
        assert demo.proc.wait(timeout=STOP_TIMEOUT_S) == 0
        output = demo.drain()
        # Checked before the clean-up below, which kills whatever is left.
        left = alive_per_ps(before) | alive_per_ps(processes_of(data_dir))
        assert not left, {pid: before.get(pid, "") for pid in left}
    finally:
        demo.kill()
    assert "Terminated 1 cluster(s): left-running." in output, output[-3000:]
    # A line per cluster state change, and none per periodic task (issue 24.6).
    assert "(ci-one): verifying → ready" in output and "(ci-one): terminating → terminated" in output
    assert "Sending due task" not in output and "succeeded in" not in output, output[-3000:]
    with sqlite3.connect(data_dir / "volt.sqlite3") as db:
        statuses = dict(db.execute("SELECT name, status FROM clusters_cluster"))
    assert statuses == {"ci-one": "terminated", "left-running": "terminated"}
