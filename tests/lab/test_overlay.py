"""A cluster's WireGuard overlay on machines behind NAT (issue 26): made with Volt's own host code over SSH
(clusters/provisioning/overlay.py), on four lab machines of three NAT'd providers.

northwind forwards a UDP port per machine (nw-01, nw-02); helios (he-01) and orion (or-01) forward none, so
he-01 and or-01 cannot dial each other: they go through a relay, a northwind node.
"""

from __future__ import annotations

import subprocess

import pytest

from clusters.provisioning import overlay
from inventory.drivers.sudo import SudoDriver
from inventory.lab import operations
from tests.lab.conftest import onboard_machine

FABRIC = {"site": "iad1", "kind": "eth_100g", "per_host_gbytes_per_s": 12.5}


def _machine(name: str, provider: str, gpus: int = 1) -> dict:
    return {"name": name, "provider": provider, "fabric": "f", "block": "r1", "gpu_model": "L40S",
            "gpu_count": gpus}  # fmt: skip


TOPOLOGY = {
    "sites": {"iad1": {"region": "us-east"}},
    "fabrics": {"f": FABRIC},
    "providers": {
        "northwind": {"nat": True},
        "helios": {"nat": True, "forward_udp": False},
        "orion": {"nat": True, "forward_udp": False},
    },
    "machines": [
        _machine("nw-01", "northwind", 2),  # two GPUs: a cluster of 2 x 2 fits northwind alone
        _machine("nw-02", "northwind", 2),
        _machine("he-01", "helios"),
        _machine("or-01", "orion"),
        _machine("he-02", "helios"),  # the spare recovery takes
    ],
}
NAMES = ("nw-01", "nw-02", "he-01", "or-01", "he-02")
IFACE = overlay.interface(901)
# Accepts one connection on the overlay address, answers with the host name, ends; waits argv[2] s at most.
SERVE = """
import socket, sys
server = socket.create_server((sys.argv[1], 7001))
server.settimeout(float(sys.argv[2]))
print("listening", flush=True)
conn, _ = server.accept()
conn.sendall(socket.gethostname().encode())
conn.close()
"""
ASK = """
import socket, sys, time
end = time.monotonic() + float(sys.argv[2])
while True:
    try:
        with socket.create_connection((sys.argv[1], 7001), timeout=3) as sock:
            print(sock.recv(64).decode())
            break
    except OSError as exc:
        if time.monotonic() > end:
            print("unreachable:", exc)
            break
        time.sleep(0.5)
"""


@pytest.fixture(scope="module")
def lab(make_lab):
    return make_lab(TOPOLOGY)


@pytest.fixture(scope="module")
def members(lab):
    _, topology = operations.read_lab(lab.base, lab.number)
    return [
        overlay.Member(m.name, m.provider, m.address, m.udp_endpoint)
        for m in (topology.machine(n) for n in NAMES)
    ]


def _root(lab, name: str) -> SudoDriver:
    return SudoDriver(lab.driver(name))


def _reach(lab, src: str, dst: str, address: str, patience_s: float = 15) -> str:
    server = subprocess.Popen(
        operations.command_in(lab.base, lab.number, dst, ["python3", "-c", SERVE, address, str(patience_s + 3)]),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout.readline().strip() == "listening", server.stderr.read()
        return lab.exec(src, "python3", "-c", ASK, address, str(patience_s)).stdout.strip()
    finally:
        server.wait(timeout=patience_s + 20)


def test_an_overlay_across_natted_providers_reaches_every_node_and_leaves_nothing_behind(lab, members):
    keys = {}
    for name in NAMES:
        with _root(lab, name) as driver:
            keys[name] = overlay.make_key(driver, IFACE)
    result = overlay.plan(members, keys, "100.96.9.0/24")
    assert result.relay == "nw-01" and result.paths[("he-01", "or-01")] == overlay.RELAY

    kinds = set()
    for name in NAMES:
        with _root(lab, name) as driver:
            kinds.add(overlay.apply(driver, IFACE, result.nodes[name]))
    assert kinds == {"wireguard-go"}  # this kernel has no WireGuard module
    try:
        for name in NAMES:  # the private key: on its host alone, root's, 0600
            assert lab.exec(name, "stat", "-c", "%a %U", f"{overlay.KEY_DIR}/{IFACE}.key").stdout.split() == [
                "600",
                "root",
            ]
            assert (
                lab.exec(name, "sh", "-c", f"wg pubkey < {overlay.KEY_DIR}/{IFACE}.key").stdout.strip()
                == keys[name]
            )

        # he-01 and or-01 first: they dial out, so each NAT learns its mapping
        for src, dst in (("he-01", "nw-01"), ("or-01", "nw-02"), ("he-01", "or-01"), ("or-01", "he-01"),
                         ("nw-01", "he-01"), ("nw-02", "nw-01")):  # fmt: skip
            assert _reach(lab, src, dst, result.nodes[dst].address) == dst, (src, dst)
    finally:
        for name in NAMES:
            with _root(lab, name) as driver:
                overlay.remove(driver, IFACE)

    for name in NAMES:
        with _root(lab, name) as driver:
            assert overlay.leftovers(driver, IFACE) == []
        assert "wireguard-go" not in lab.exec(name, "ps", "-e", "-o", "comm=").stdout


def _overlay(lab, members, iface: str, network: str, names: tuple[str, ...]) -> overlay.Plan:
    chosen = [m for m in members if m.name in names]
    keys = {}
    for name in names:
        with _root(lab, name) as driver:
            keys[name] = overlay.make_key(driver, iface)
    plan = overlay.plan(chosen, keys, network)
    for name in names:
        with _root(lab, name) as driver:
            overlay.apply(driver, iface, plan.nodes[name])
    return plan


def test_a_node_of_one_clusters_overlay_reaches_nothing_of_anothers(lab, members):
    """Cluster A (nw-01, he-01) and cluster B (nw-02, or-01), each its own interface and range: B's nodes
    serve on their overlay addresses, and A's cannot open a connection to them, by the routes they have or
    by sending B's range into A's interface (root on A's host could add that route; WireGuard drops what no
    peer of A's may receive)."""
    a = _overlay(lab, members, "vo911", "100.96.11.0/24", ("nw-01", "he-01"))
    b = _overlay(lab, members, "vo912", "100.96.12.0/24", ("nw-02", "or-01"))
    try:
        assert _reach(lab, "he-01", "nw-01", a.nodes["nw-01"].address) == "nw-01"  # each works on its own
        assert _reach(lab, "or-01", "nw-02", b.nodes["nw-02"].address) == "nw-02"
        for src in ("nw-01", "he-01"):
            for dst in ("nw-02", "or-01"):
                assert _reach(lab, src, dst, b.nodes[dst].address, patience_s=3).startswith("unreachable"), (
                    src,
                    dst,
                )
        for src in ("nw-01", "he-01"):
            lab.exec(src, "ip", "route", "add", "100.96.12.0/24", "dev", "vo911")
        for src in ("nw-01", "he-01"):
            for dst in ("nw-02", "or-01"):
                assert _reach(lab, src, dst, b.nodes[dst].address, patience_s=3).startswith("unreachable"), (
                    src,
                    dst,
                )
    finally:
        for iface, names in (("vo911", ("nw-01", "he-01")), ("vo912", ("nw-02", "or-01"))):
            for name in names:
                with _root(lab, name) as driver:
                    overlay.remove(driver, iface)


# --- a Volt cluster across the NAT'd providers ---------------------------------------------------------


@pytest.fixture
def lab_hosts(lab, northwind, helios, make_user, settings):
    from django.db import connection

    from inventory import runtimes, services, tunnels
    from inventory.choices import FabricKind, HostState

    settings.VOLT_SSH_SHARED_DIR = "/mnt/volt-shared"
    settings.VOLT_STORE_NODE_ENDPOINT = lab.status().store_endpoint
    settings.VOLT_PROBE_MAX_MB = 4
    settings.VOLT_PROBE_ITERS = 2
    settings.VOLT_NODE_JOIN_TIMEOUT_S = 150
    settings.VOLT_SLOW_HOST_REPLACEMENTS = 0
    settings.VOLT_JOB_POLL_S = 1.0
    orion = services.review_provider(
        services.register_provider(make_user("oona"), "Orion", "ops@orion.example"), approve=True
    )
    site = services.get_or_create_site("iad1", "us-east")
    fabrics = {
        provider.name.lower(): services.create_fabric(
            provider, site, f"{provider.name.lower()}-eth", FabricKind.ETH_100G, 12.5, 1.0, ["r1"]
        )
        for provider in (northwind, helios, orion)
    }
    providers = {"northwind": northwind, "helios": helios, "orion": orion}
    _, topology = operations.read_lab(lab.base, lab.number)
    hosts = []
    for name in NAMES:
        provider = topology.machine(name).provider
        host = onboard_machine(lab, providers[provider], fabrics[provider], name)
        assert host.state == HostState.AVAILABLE, host.error_message
        host = runtimes.install_runtime(host.pk)
        assert host.runtime["state"] == "ready", host.runtime
        hosts.append(host)
    connection.close()
    yield hosts
    from clusters import services as clusters
    from clusters.models import Cluster

    for cluster in Cluster.objects.exclude(status__in=["terminated", "failed"]):
        clusters.terminate_cluster(cluster, wait=True)
    tunnels.close_all()


def _links(lab, name: str) -> list[str]:
    return [
        line.split(":")[1].strip().split("@")[0] for line in lab.ssh(name, "ip -o link show").splitlines()
    ]


@pytest.mark.django_db(transaction=True)
def test_a_cluster_across_natted_providers_forms_on_its_overlay_runs_a_job_and_leaves_nothing(
    lab, lab_hosts, alice, team_a, tmp_path
):
    from clusters import provision, services
    from clusters.models import BandwidthSample
    from inventory import services as inventory
    from inventory.models import Host
    from jobs import services as jobs
    from tests.clusters.live_helpers import worker_and_beat
    from tests.integration.test_recovery import wait_job

    # Within one provider: its nodes reach each other directly (checked at onboarding), no overlay.
    direct = services.request_cluster(
        team_a, alice, {"name": "one-network", "nodes": 2, "gpus_per_node": 2, "gpu_models": ["L40S"]}
    )
    services.place_cluster(direct.pk)
    direct.refresh_from_db()
    assert direct.plan["network_path"] == "direct" and direct.plan["direct_busbw_gbps"] is None
    direct = provision.provision_cluster(direct.pk)
    assert direct.status == "ready", direct.failure_message
    assert direct.network_path == "direct" and direct.overlay_network == ""
    assert all(not link.startswith("vo") for name in ("nw-01", "nw-02") for link in _links(lab, name))
    services.terminate_cluster(direct, alice, wait=True)

    # Across the three: an overlay, he-01 and or-01 (no UDP port forwarded) through a northwind relay.
    inventory.act_on_host(Host.objects.get(name="he-02"), "cordon", reason="not this test's")
    cluster = services.request_cluster(
        team_a, alice, {"name": "across", "nodes": 4, "gpus_per_node": 1, "gpu_models": ["L40S"]}
    )
    services.place_cluster(cluster.pk)
    cluster.refresh_from_db()
    # The plan knew the path before any key existed, and predicts at the relay's cost.
    assert cluster.plan["network_path"] == "relay", cluster.plan["explanation"]
    assert cluster.predicted_busbw_gbps < cluster.plan["direct_busbw_gbps"]
    cluster = provision.provision_cluster(cluster.pk)
    assert cluster.status == "ready", cluster.failure_message
    assert cluster.network_path == "relay" and cluster.overlay_network.startswith("100.9")
    # Its probe is kept as the relay's cost, which the next plan between such hosts predicts from.
    sample = BandwidthSample.objects.get(cluster=cluster)
    assert sample.level == "relay" and sample.predicted_gbps == cluster.plan["direct_busbw_gbps"]
    iface = overlay.interface(cluster.pk)
    nodes = list(cluster.nodes.select_related("host"))
    assert all(node.node_ip.startswith(cluster.overlay_network.rsplit(".", 1)[0]) for node in nodes)
    assert cluster.ray_address.startswith(cluster.overlay_network.rsplit(".", 1)[0])
    assert cluster.probe_result["nodes"] == 4
    messages = list(cluster.events.values_list("message", flat=True))
    assert any(f"Network: overlay {iface}" in m and "through the relay nw-0" in m for m in messages), messages

    with worker_and_beat(tmp_path, 2.0, entries=("poll-jobs",)):
        job = jobs.submit_job(cluster, alice, jobs.demo_entrypoint(20, 10, 0, 0.0), working_dir=jobs.WORKLOADS_DIR,
                              checkpoint_every=10, is_demo=True)  # fmt: skip
        job = wait_job(job.pk, lambda j: j.status in ("succeeded", "failed", "stopped"), 400, "the demo job")
    assert job.status == "succeeded", (job.status_reason, jobs.read_log(job)["text"][-3000:])
    assert job.checkpoints.filter(synchronized=True).count() >= 2

    services.terminate_cluster(cluster, alice, wait=True)
    for name in NAMES:
        with _root(lab, name) as driver:
            assert overlay.leftovers(driver, iface) == [], name
        assert iface not in _links(lab, name)


@pytest.mark.django_db(transaction=True)
def test_recovery_keys_the_replacement_into_the_overlay_and_the_job_resumes(
    lab, lab_hosts, alice, team_a, tmp_path
):
    from clusters import provision, services
    from inventory import services as inventory
    from inventory.models import Host
    from jobs import services as jobs
    from tests.clusters.live_helpers import worker_and_beat
    from tests.integration.test_recovery import last_recovery_id, wait_job, wait_recovery

    inventory.act_on_host(
        Host.objects.get(name="he-02"), "cordon", reason="the spare, kept out of the first placement"
    )
    cluster = services.request_cluster(
        team_a, alice, {"name": "recovering", "nodes": 4, "gpus_per_node": 1, "gpu_models": ["L40S"]}
    )
    services.place_cluster(cluster.pk)
    cluster = provision.provision_cluster(cluster.pk)
    assert cluster.status == "ready", cluster.failure_message
    inventory.act_on_host(Host.objects.get(name="he-02"), "uncordon")
    before = {n.host.name: n.overlay_address for n in provision.active_nodes(cluster)}
    assert set(before) == {"nw-01", "nw-02", "he-01", "or-01"} and all(before.values())
    victim = next(n for n in provision.active_nodes(cluster) if n.host.name == "he-01")
    assert not victim.is_head

    try:
        with worker_and_beat(
            tmp_path, 2.0, entries=("watch-clusters", "poll-jobs"), also={"retry-recoveries": 2.0}
        ):
            job = jobs.submit_job(cluster, alice, jobs.demo_entrypoint(60, 10, 0, 0.5), working_dir=jobs.WORKLOADS_DIR,
                                  checkpoint_every=10, is_demo=True)  # fmt: skip
            wait_job(job.pk, lambda j: (j.last_step or 0) >= 25, 300, "the demo past its second checkpoint")
            since = last_recovery_id(cluster)
            lab.manage("power-off", "he-01")
            recovery = wait_recovery(cluster, since, status="succeeded")
            assert [h["name"] for h in recovery.failed_hosts] == ["he-01"]
            job = wait_job(job.pk, lambda j: j.status in ("succeeded", "failed", "stopped"), 500, "the end")
        assert job.status == "succeeded", (job.status_reason, jobs.read_log(job)["text"][-3000:])
        assert job.attempt == 2 and job.last_step == 60

        after = {n.host.name: n.overlay_address for n in provision.active_nodes(cluster)}
        assert set(after) == {"nw-01", "nw-02", "or-01", "he-02"}
        assert {k: v for k, v in after.items() if k != "he-02"} == {
            k: v for k, v in before.items() if k != "he-01"
        }
        assert after["he-02"] and after["he-02"] not in {v for k, v in after.items() if k != "he-02"}
        iface = overlay.interface(cluster.pk)
        replacement_key = lab.exec(
            "he-02", "sh", "-c", f"wg pubkey < {overlay.KEY_DIR}/{iface}.key"
        ).stdout.strip()
        for name in ("nw-01", "nw-02"):  # the survivors that dial it: its key, not the dead node's
            peers = lab.exec(name, "wg", "show", iface, "peers").stdout.split()
            assert replacement_key in peers and len(peers) == 3, (name, peers)
        cluster.refresh_from_db()
        assert cluster.status == "ready"
        services.terminate_cluster(cluster, alice, wait=True)
    finally:
        lab.manage("power-on", "he-01", check=False)
