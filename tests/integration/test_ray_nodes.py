"""Ray nodes on local hosts for real: start, join, probe, run tasks, stop (no database).

Addresses 127.0.9.2-8 and port slots 90-96 (ports 24500-24849) keep clear of the local hosts the
application creates (127.0.0.2 upward, low slots). Every node a test starts is stopped at teardown,
even when the test fails. On this 2-core machine the file takes ~75 s.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from clusters.probes.allreduce import MB
from clusters.probes.launch import ProbeHost, run_probe
from clusters.provisioning import (
    MAX_SLOT,
    NodeHandle,
    NodesNotReady,
    NodeStartFailed,
    find_node,
    host_resource_name,
    node_processes,
    ports_for,
    probe_port,
    start_head,
    start_worker,
    stop_node,
    submit_job,
    wait_for_nodes,
)
from inventory.drivers.base import fan_out
from inventory.drivers.local import LocalDriver, create_sandbox

pytestmark = pytest.mark.integration

SPEC = {"gpus": [{"model": "H100"}] * 8}
GPUS = 8
NODE_OPTIONS = {"num_gpus": GPUS, "object_store_bytes": 150 * MB}
JOIN_TIMEOUT_S = 90.0


@dataclass
class Nodes:
    """Starts Ray nodes on local hosts and remembers them so teardown can stop every one."""

    sandboxes: Path
    temp_root: str
    started: list[tuple[LocalDriver, str]] = field(default_factory=list)

    def host(self, last_octet: int) -> LocalDriver:
        driver = LocalDriver(self.sandboxes / f"host-{last_octet}", f"127.0.9.{last_octet}")
        create_sandbox(driver.sandbox, SPEC)
        return driver

    def temp_dir(self, driver: LocalDriver, cluster_id: str) -> str:
        return f"{self.temp_root}/{cluster_id}-{driver.address.rsplit('.', 1)[1]}"

    def head(self, driver: LocalDriver, cluster_id: str, slot: int, **options) -> NodeHandle:
        self._remember(driver, cluster_id)
        return start_head(
            driver, cluster_id=cluster_id, ports=ports_for(slot), temp_dir=self.temp_dir(driver, cluster_id),
            **{**NODE_OPTIONS, **options},
        )  # fmt: skip

    def worker(
        self, driver: LocalDriver, cluster_id: str, slot: int, head_address: str, **options
    ) -> NodeHandle:
        self._remember(driver, cluster_id)
        return start_worker(
            driver, cluster_id=cluster_id, head_address=head_address, ports=ports_for(slot),
            temp_dir=self.temp_dir(driver, cluster_id), **{**NODE_OPTIONS, **options},
        )  # fmt: skip

    def _remember(self, driver: LocalDriver, cluster_id: str) -> None:
        if not any(d is driver and c == cluster_id for d, c in self.started):
            self.started.append((driver, cluster_id))

    def stop_all(self) -> list[str]:
        """Stop every node started here (in parallel); describe any process that survived."""

        def stop(pair: tuple[LocalDriver, str]) -> str | None:
            driver, cluster_id = pair
            try:
                stop_node(driver, cluster_id)
                left = node_processes(driver, cluster_id)
            except Exception as exc:  # noqa: BLE001 - reported with the others
                return f"{cluster_id} on {driver.address}: {exc!r}"
            return f"{cluster_id} on {driver.address}: {left} still running" if left else None

        with ThreadPoolExecutor(max_workers=8) as pool:
            return [problem for problem in pool.map(stop, self.started) if problem]


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    # Ray's socket paths must fit in 107 bytes: temp dirs live in a short folder, not under tmp_path.
    temp_root = tempfile.mkdtemp(prefix="vr-", dir="/tmp")
    manager = Nodes(tmp_path_factory.mktemp("hosts"), temp_root)
    try:
        yield manager
    finally:
        survivors = manager.stop_all()
        shutil.rmtree(temp_root, ignore_errors=True)
        assert not survivors, f"Ray processes survived teardown: {survivors}"


@dataclass
class Cluster:
    cluster_id: str
    head: NodeHandle
    drivers: list[LocalDriver]
    handles: list[NodeHandle]

    @property
    def ips(self) -> list[str]:
        return [driver.address for driver in self.drivers]


def start_cluster(nodes: Nodes, cluster_id: str, octets: list[int], slots: list[int], **options) -> Cluster:
    """A head on the first host, workers (in parallel) on the others, all reported ALIVE."""
    drivers = [nodes.host(octet) for octet in octets]
    head = nodes.head(drivers[0], cluster_id, slots[0], **options)
    wait_for_nodes(head.dashboard_url, 1, JOIN_TIMEOUT_S)
    workers = fan_out(
        drivers[1:],
        lambda d: nodes.worker(d, cluster_id, slots[drivers.index(d)], head.gcs_address, **options),
    )
    for outcome in workers:
        if isinstance(outcome, BaseException):
            raise outcome
    wait_for_nodes(
        head.dashboard_url, len(drivers), JOIN_TIMEOUT_S, expected_ips=[d.address for d in drivers]
    )
    return Cluster(cluster_id, head, drivers, [head, *workers])


@pytest.fixture(scope="module")
def cluster(nodes: Nodes) -> Cluster:
    """Cluster "t-alpha": head 127.0.9.2 + workers 127.0.9.3, 127.0.9.4 (slots 90-92)."""
    return start_cluster(nodes, "t-alpha", [2, 3, 4], [90, 91, 92])


def test_port_blocks_are_disjoint_and_clear_of_reserved_ranges():
    blocks = [set(dataclasses.astuple(ports_for(slot))[:-2]) for slot in range(MAX_SLOT + 1)]
    workers = [
        range(ports_for(slot).min_worker, ports_for(slot).max_worker + 1) for slot in range(MAX_SLOT + 1)
    ]
    every_port = [port for fixed, window in zip(blocks, workers, strict=True) for port in (*fixed, *window)]

    assert len(every_port) == len(set(every_port))  # no two slots, and no fixed port and worker port, collide
    assert (
        min(every_port) >= 20000 and max(every_port) < 25000
    )  # above Ray's worker range, below RabbitMQ 25672
    assert all(len(window) >= 30 for window in workers)
    with pytest.raises(ValueError, match="outside"):
        ports_for(MAX_SLOT + 1)


def test_head_and_workers_join_and_report_alive(cluster: Cluster):
    alive = wait_for_nodes(cluster.head.dashboard_url, 3, 10, expected_ips=cluster.ips)

    assert sorted(node["node_ip"] for node in alive) == cluster.ips
    assert [node["node_ip"] for node in alive if node["is_head_node"]] == ["127.0.9.2"]
    for node in alive:
        assert node["resources_total"]["GPU"] == GPUS
        assert node["resources_total"][host_resource_name(node["node_ip"])] == 1
    assert all(node_processes(driver, cluster.cluster_id) for driver in cluster.drivers)


def test_starting_a_running_node_again_returns_the_same_process(nodes: Nodes, cluster: Cluster):
    head_again = nodes.head(cluster.drivers[0], cluster.cluster_id, 90)
    worker_again = nodes.worker(cluster.drivers[1], cluster.cluster_id, 91, cluster.head.gcs_address)

    assert head_again.pid == cluster.head.pid and head_again.is_head
    assert worker_again.pid == cluster.handles[1].pid and not worker_again.is_head
    assert find_node(cluster.drivers[2], cluster.cluster_id) == cluster.handles[2]
    assert len(wait_for_nodes(cluster.head.dashboard_url, 3, 10)) == 3


def test_starting_a_different_node_over_a_running_one_is_refused(nodes: Nodes, cluster: Cluster):
    with pytest.raises(NodeStartFailed, match="a worker node of t-alpha already runs on 127.0.9.3"):
        nodes.head(cluster.drivers[1], cluster.cluster_id, 91)

    assert find_node(cluster.drivers[1], cluster.cluster_id) == cluster.handles[1]


def test_allreduce_probe_reports_bandwidth_for_every_size(cluster: Cluster):
    hosts = [ProbeHost(driver, driver.address, sys.executable) for driver in cluster.drivers]

    probe = run_probe(hosts, probe_port(90), max_mb=8, iters=5, warmup=2, timeout_s=180)

    assert probe.status == "SUCCEEDED", probe.output[-3000:]
    result = probe.result
    assert result["nodes"] == 3 and result["backend"] == "gloo" and result["correct"]
    assert result["node_ips"] == cluster.ips  # rank 0 first: the order the caller gave
    assert [row["bytes"] for row in result["results"]] == [1 * MB, 2 * MB, 4 * MB, 8 * MB]
    for row in result["results"]:
        assert row["time_s"] > 0 and row["busbw_gbps"] > 0
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 4 / 3)
    assert result["max_busbw_gbps"] == max(row["busbw_gbps"] for row in result["results"])
    # the per-host phase: every host alone, then every ring link alone
    assert [h["node_ip"] for h in result["hosts"]] == result["node_ips"]
    assert all(h["local_gbps"] > 0 and h["link_gbps"] > 0 for h in result["hosts"])
    assert [link["ranks"] for link in result["links"]] == [[0, 1], [1, 2], [2, 0]]


def test_the_probe_skips_its_per_host_phase_when_the_sweep_meets_the_threshold(cluster: Cluster):
    hosts = [ProbeHost(driver, driver.address, sys.executable) for driver in cluster.drivers[:2]]

    probe = run_probe(hosts, probe_port(90), max_mb=1, iters=2, warmup=1, hosts_below_gbps=1e-6)

    assert probe.status == "SUCCEEDED", probe.output[-3000:]
    assert (
        probe.result["hosts_phase"]["ran"] is False and "met 1e-06 GB/s" in probe.result["hosts_phase"]["why"]
    )
    assert probe.result["hosts"] == [] and probe.result["links"] == [] and probe.result["max_busbw_gbps"] > 0


def test_a_probe_rank_that_cannot_start_fails_the_probe_at_once_and_leaves_no_rank(cluster: Cluster):
    hosts = [ProbeHost(driver, driver.address, sys.executable) for driver in cluster.drivers[:2]]
    hosts.append(ProbeHost(cluster.drivers[2], cluster.drivers[2].address, "/nonexistent/python"))
    started = time.monotonic()

    probe = run_probe(hosts, probe_port(90), max_mb=1, iters=2, warmup=1)

    assert probe.status == "FAILED" and probe.result is None
    assert probe.output.startswith("rank 2 on 127.0.9.4 exited 127: ")
    assert "/nonexistent/python" in probe.output
    assert time.monotonic() - started < 30  # not the 60 s rendezvous the other ranks would have waited
    marked = cluster.drivers[0].run("grep -lz VOLT_PROBE_RUN= /proc/[0-9]*/environ 2>/dev/null; true")
    assert marked.stdout.strip() == ""  # the two waiting ranks were killed


def test_a_task_pinned_to_each_host_runs_on_that_host(cluster: Cluster, tmp_path: Path):
    (tmp_path / "where.py").write_text(
        textwrap.dedent(
            f"""
            import json, ray
            ray.init()

            @ray.remote(num_cpus=0)
            def where():
                return ray.util.get_node_ip_address()

            ips = {cluster.ips!r}
            seen = ray.get([where.options(resources={{"volt_host_" + ip.replace(".", "_"): 0.01}}).remote()
                            for ip in ips], timeout=120)
            print("WHERE " + json.dumps(dict(zip(ips, seen))))
            """
        )
    )

    status, logs = submit_job(
        cluster.head.dashboard_url, "python where.py", {"working_dir": str(tmp_path)}, timeout_s=120
    )

    assert status == "SUCCEEDED", logs[-3000:]
    line = next(line for line in logs.splitlines() if line.startswith("WHERE "))
    assert json.loads(line[len("WHERE ") :]) == {ip: ip for ip in cluster.ips}


def test_a_worker_pointed_at_a_wrong_head_never_joins(nodes: Nodes, cluster: Cluster):
    stray = nodes.host(5)
    nodes.worker(stray, "t-alpha", 93, "127.0.9.99:24999")  # nothing listens there

    started = time.monotonic()
    with pytest.raises(NodesNotReady) as raised:
        wait_for_nodes(cluster.head.dashboard_url, 4, 8, expected_ips=[*cluster.ips, stray.address])
    elapsed = time.monotonic() - started

    assert elapsed < 8 + 6
    assert raised.value.missing == ["127.0.9.5"]
    assert raised.value.alive == cluster.ips
    message = str(raised.value)
    assert "3 of 4 nodes ALIVE" in message and "not joined: 127.0.9.5" in message
    assert "127.0.9.2, 127.0.9.3, 127.0.9.4" in message

    assert stop_node(stray, "t-alpha") == []
    assert node_processes(stray, "t-alpha") == []
    assert stop_node(stray, "t-alpha") == []  # idempotent


def test_a_node_that_cannot_start_fails_at_once_with_its_output(nodes: Nodes):
    broken = nodes.host(8)

    with pytest.raises(NodeStartFailed, match="No such file"):
        nodes.head(broken, "t-broken", 96, python="/nonexistent/python3")

    assert find_node(broken, "t-broken") is None
    assert node_processes(broken, "t-broken") == []


def test_two_clusters_on_disjoint_hosts_coexist_and_stop_independently(nodes: Nodes, cluster: Cluster):
    # Started through an explicit interpreter (`python -m ray.scripts.scripts`), as on SSH hosts.
    other = start_cluster(nodes, "t-beta", [6, 7], [94, 95], python=sys.executable)

    assert sorted(n["node_ip"] for n in wait_for_nodes(other.head.dashboard_url, 2, 10)) == other.ips
    assert sorted(n["node_ip"] for n in wait_for_nodes(cluster.head.dashboard_url, 3, 10)) == cluster.ips

    outcomes = fan_out(other.drivers, lambda d: stop_node(d, other.cluster_id))

    assert outcomes == [[], []]
    assert all(node_processes(driver, other.cluster_id) == [] for driver in other.drivers)
    assert sorted(n["node_ip"] for n in wait_for_nodes(cluster.head.dashboard_url, 3, 10)) == cluster.ips
    assert all(node_processes(driver, cluster.cluster_id) for driver in cluster.drivers)


def test_stopping_every_node_leaves_no_process_of_the_cluster(cluster: Cluster):
    """Runs last on the shared cluster: stops it (teardown then finds nothing to stop)."""
    outcomes = fan_out(cluster.drivers, lambda d: stop_node(d, cluster.cluster_id))

    assert outcomes == [[], [], []]
    for driver in cluster.drivers:
        assert node_processes(driver, cluster.cluster_id) == []
        assert find_node(driver, cluster.cluster_id) is None
    with pytest.raises(NodesNotReady, match="did not answer"):
        wait_for_nodes(cluster.head.dashboard_url, 1, 2, poll_s=0.5)
