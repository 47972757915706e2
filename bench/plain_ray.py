"""Plain Ray clusters on loopback, started by hand (no Volt): baselines for benches, and tests.

What a researcher does without Volt, on local hosts (DESIGN.md "Facts learned the hard way"):
`ray start --block` per node in its own session, on its own 127.0.0.N address, with every port and its
own temp dir given explicitly; the head's dashboard serves job submission. Nodes are stopped by the
PIDs of their own processes (each node's processes carry a marker in their environment, found in
/proc), never with `ray stop`.

Ports: slot s owns 26000 + 50 s .. + 49 (same offsets as clusters/provisioning/ray_nodes.py, above
Volt's own 20000-24999 range). Pure Python; imports nothing of Volt.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PORT_BASE = 26000
PORTS_PER_SLOT = 50
MARKER_VAR = "VOLT_PLAIN_RAY_NODE"
RAY = str(Path(sys.executable).with_name("ray"))


def _ports(slot: int) -> dict[str, int]:
    base = PORT_BASE + PORTS_PER_SLOT * slot
    if not 0 <= slot < 100:
        raise ValueError(f"slot {slot} outside 0..99")
    return {"gcs": base, "dashboard": base + 1, "agent_listen": base + 2, "agent_grpc": base + 3,
            "node_manager": base + 4, "object_manager": base + 5, "metrics_export": base + 6,
            "runtime_env_agent": base + 7, "client_server": base + 8, "dashboard_metrics": base + 9,
            "autoscaler_metrics": base + 10, "min_worker": base + 15, "max_worker": base + 49}  # fmt: skip


@dataclass
class PlainNode:
    """One `ray start --block` node: its address, port slot, temp dir and the process we started."""

    ip: str
    slot: int
    temp_dir: str
    is_head: bool
    marker: str
    process: subprocess.Popen | None = None
    log_path: str = ""

    @property
    def ports(self) -> dict[str, int]:
        return _ports(self.slot)


@dataclass
class PlainRayCluster:
    """A head and workers on distinct 127.0.0.N addresses; `start`, `add_worker`, `kill_node`, `stop`."""

    ips: list[str]
    first_slot: int = 0
    num_cpus: int = 2
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = ""
    nodes: list[PlainNode] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.workdir:
            self.workdir = tempfile.mkdtemp(prefix="vplain-")
        self._tag = f"{os.getpid()}-{self.first_slot}"
        self._next_slot = self.first_slot

    @property
    def head(self) -> PlainNode:
        return self.nodes[0]

    @property
    def gcs_address(self) -> str:
        return f"{self.head.ip}:{self.head.ports['gcs']}"

    @property
    def dashboard_url(self) -> str:
        return f"http://{self.head.ip}:{self.head.ports['dashboard']}"

    def start(self, timeout_s: float = 120.0) -> float:
        """Start the head, then every worker at once; wait until all are ALIVE. Returns seconds taken."""
        started = time.monotonic()
        self._launch(self.ips[0], head=True)
        self.wait_dashboard(timeout_s)
        for ip in self.ips[1:]:
            self._launch(ip, head=False)
        self.wait_alive(len(self.ips), timeout_s - (time.monotonic() - started))
        return time.monotonic() - started

    def add_worker(self, ip: str) -> PlainNode:
        """Start one more worker joining the head (does not wait)."""
        return self._launch(ip, head=False)

    def _launch(self, ip: str, head: bool) -> PlainNode:
        slot = self._next_slot
        self._next_slot += 1
        temp_dir = f"/tmp/vpr-{self._tag}-{slot}"  # short: Ray's socket paths must fit 107 bytes
        shutil.rmtree(temp_dir, ignore_errors=True)
        os.makedirs(temp_dir)
        node = PlainNode(ip, slot, temp_dir, head, f"{self._tag}@{ip}#{slot}")
        ports = node.ports
        role = (["--head", f"--port={ports['gcs']}", "--include-dashboard=true", f"--dashboard-host={ip}",
                 f"--dashboard-port={ports['dashboard']}", f"--ray-client-server-port={ports['client_server']}"]
                if head else [f"--address={self.gcs_address}"])  # fmt: skip
        command = [
            RAY, "start", "--block", *role, f"--node-ip-address={ip}",
            f"--node-manager-port={ports['node_manager']}", f"--object-manager-port={ports['object_manager']}",
            f"--metrics-export-port={ports['metrics_export']}",
            f"--dashboard-agent-listen-port={ports['agent_listen']}",
            f"--dashboard-agent-grpc-port={ports['agent_grpc']}",
            f"--runtime-env-agent-port={ports['runtime_env_agent']}",
            f"--min-worker-port={ports['min_worker']}", f"--max-worker-port={ports['max_worker']}",
            f"--temp-dir={temp_dir}", f"--num-cpus={self.num_cpus}", "--num-gpus=0",
            "--disable-usage-stats", "--log-style=record", "--log-color=false",
        ]  # fmt: skip
        env = {**os.environ, **self.env, MARKER_VAR: node.marker, "RAY_USAGE_STATS_ENABLED": "0",
               "DASHBOARD_METRIC_PORT": str(ports["dashboard_metrics"]),
               "AUTOSCALER_METRIC_PORT": str(ports["autoscaler_metrics"])}  # fmt: skip
        # As with an activated venv: `python` in a job's entrypoint is this environment's.
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        for name in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH"):
            env.pop(name, None)
        node.log_path = os.path.join(self.workdir, f"node-{slot}.log")
        with open(node.log_path, "wb") as log:
            node.process = subprocess.Popen(
                command, env=env, cwd=temp_dir, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        self.nodes.append(node)
        return node

    def wait_dashboard(self, timeout_s: float) -> None:
        self._poll(lambda: self.list_nodes() is not None, timeout_s, "the head's dashboard to answer")

    def list_nodes(self) -> list[dict[str, Any]]:
        url = f"{self.dashboard_url}/api/v0/nodes?limit=1000&timeout=5"
        with urllib.request.urlopen(url, timeout=6) as response:
            body = json.load(response)
        if not body.get("result"):
            raise ValueError(str(body.get("msg")))
        return body["data"]["result"]["result"]

    def alive_ips(self) -> list[str]:
        return sorted(n["node_ip"] for n in self.list_nodes() if n.get("state") == "ALIVE")

    def wait_alive(self, count: int, timeout_s: float, ips: list[str] | None = None) -> None:
        """Until `count` nodes (and every one of `ips`) are ALIVE."""
        self._poll(lambda: len(self.alive_ips()) >= count and set(ips or ()) <= set(self.alive_ips()),
                   timeout_s, f"{count} nodes ALIVE")  # fmt: skip

    def _poll(self, check: Any, timeout_s: float, what: str, poll_s: float = 0.25) -> None:
        deadline = time.monotonic() + max(timeout_s, 1.0)
        error: Exception | None = None
        while time.monotonic() < deadline:
            try:
                if check():
                    return
            except (OSError, ValueError) as exc:
                error = exc
            time.sleep(poll_s)
        logs = "\n".join(self.tail(node, 15) for node in self.nodes)
        raise TimeoutError(f"plain Ray cluster: no {what} after {timeout_s:.0f} s ({error!r})\n{logs}")

    def tail(self, node: PlainNode, lines: int = 20) -> str:
        try:
            text = Path(node.log_path).read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return f"--- {node.ip} (slot {node.slot}) ---\n" + "\n".join(text)

    def node_pids(self, node: PlainNode) -> list[int]:
        """PIDs of every live process carrying this node's marker (Ray's workers, raylet, drivers ...)."""
        needle = f"{MARKER_VAR}={node.marker}\0".encode()
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as handle:
                    if needle not in handle.read() + b"\0":
                        continue
                with open(f"/proc/{entry}/stat") as handle:
                    if handle.read().rsplit(")", 1)[1].split()[0] == "Z":
                        continue
            except OSError:
                continue
            pids.append(int(entry))
        if node.process is not None and node.process.poll() is None and node.process.pid not in pids:
            pids.append(node.process.pid)
        return sorted(pids)

    def kill_node(self, node: PlainNode, sig: int = signal.SIGKILL) -> list[int]:
        """Send `sig` to every process of `node` (by PID); returns the PIDs signalled."""
        pids = self.node_pids(node)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if node.process is not None:
            try:
                node.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        return pids

    def stop(self) -> None:
        """Stop every node: SIGTERM workers (then KILL), SIGKILL the head's processes; remove temp dirs."""
        for node in reversed(self.nodes):
            self.kill_node(node, signal.SIGTERM if not node.is_head else signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(self.node_pids(node) for node in self.nodes):
            time.sleep(0.2)
        for node in self.nodes:
            self.kill_node(node, signal.SIGKILL)
            shutil.rmtree(node.temp_dir, ignore_errors=True)

    def __enter__(self) -> PlainRayCluster:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
