"""A cluster's WireGuard overlay on the lab: the probe's busbw direct vs overlay vs relay, the overlay's set-up
per node, and request → READY of a 4-node cluster across two NAT'd providers.

    sudo .venv/bin/python bench/overlay.py [--lab 91] [--rounds 3] [--mb 8] [--iters 10]

Root only (the lab makes namespaces). A lab of five machines, every provider behind NAT with a UDP port
forwarded per machine: northwind nw-01, nw-02, nw-03 (one block: the lab's block rate between them),
helios he-01, he-02. Then:

- busbw: Volt's all-reduce probe (clusters/probes/allreduce.py, gloo, 2 ranks, --mb largest message), run
  inside nw-01 and nw-02 from Volt's runtime there (installed for the READY case, below), alternating for --rounds: on their own addresses
  (direct), over a 2-node overlay between them (overlay), and over a 3-node overlay in which neither may
  dial the other, so their traffic goes through nw-03 (relay). Each figure is the probe's busbw at its
  largest message; medians. Target: overlay / direct >= 0.8 at the lab's block rate;
- setup_s_per_node: the overlay's set-up on a host, over SSH as Volt does it (key made there, interface,
  peers), per node, median of the two overlays' nodes;
- cross_provider_ready_s: nw-01, nw-02, he-01, he-02 onboarded as Volt's SSH hosts (reachability checked,
  runtime installed), then request → READY of a 4-node cluster (placement, the overlay, Ray, the probe).

The lab is taken down at the end whatever happened. The last line printed is the JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench._common import emit_json, print_table  # noqa: E402
from bench.lab import lab, machine_driver, setup  # noqa: E402

PROBE = ROOT / "clusters" / "probes" / "allreduce.py"
PORT = 29611


def topology() -> dict:
    def machine(name: str, provider: str, fabric: str) -> dict:
        return {"name": name, "provider": provider, "fabric": fabric, "block": "r1", "gpu_model": "H100",
                "gpu_count": 2}  # fmt: skip

    return {
        "sites": {"iad1": {"region": "us-east", "backbone_gbytes_per_s": 12.5},
                  "ord1": {"region": "us-east", "backbone_gbytes_per_s": 12.5}},
        "fabrics": {"iad1-ndr": {"site": "iad1", "kind": "ib_ndr", "per_host_gbytes_per_s": 400.0},
                    "ord1-roce": {"site": "ord1", "kind": "roce", "per_host_gbytes_per_s": 200.0}},
        "providers": {"northwind": {"nat": True}, "helios": {"nat": True}},
        "machines": [machine("nw-01", "northwind", "iad1-ndr"), machine("nw-02", "northwind", "iad1-ndr"),
                     machine("nw-03", "northwind", "iad1-ndr"), machine("he-01", "helios", "ord1-roce"),
                     machine("he-02", "helios", "ord1-roce")],
    }  # fmt: skip


def probe(number: int, base: Path, python: str, addresses: tuple[str, str], mb: int, iters: int) -> float:
    """The probe between nw-01 (rank 0) and nw-02 on `addresses`, from Volt's runtime on them (`python`); its
    busbw at the largest message, GB/s."""
    from clusters.probes.allreduce import parse_result
    from inventory.lab import operations

    def rank(r: int) -> list[str]:
        argv = [python, "-c", PROBE.read_text(), "--rank", str(r), "--world", "2", "--master", addresses[0], "--port",
                str(PORT), "--node-ip", addresses[r], "--max-mb", str(mb), "--iters", str(iters), "--backend",
                "gloo", "--warmup", "2"]  # fmt: skip
        return operations.command_in(base, number, ("nw-01", "nw-02")[r], argv)

    ranks = [
        subprocess.Popen(rank(r), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)
    ]
    try:
        out = [p.communicate(timeout=300)[0] for p in ranks]
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
    result = parse_result(out[0])
    return result["max_busbw_gbps"]


def make_overlay(status, iface: str, network: str, members) -> tuple[dict, list[float]]:
    """Set the overlay up on its members' machines as Volt does (over SSH, as root); per-node seconds."""
    from clusters.provisioning import overlay
    from inventory.drivers.sudo import SudoDriver

    keys, seconds = {}, {}
    for member in members:
        started = time.perf_counter()
        with SudoDriver(machine_driver(status, member.name)) as driver:
            keys[member.name] = overlay.make_key(driver, iface)
        seconds[member.name] = time.perf_counter() - started
    plan = overlay.plan(members, keys, network)
    for member in members:
        started = time.perf_counter()
        with SudoDriver(machine_driver(status, member.name)) as driver:
            overlay.apply(driver, iface, plan.nodes[member.name])
        seconds[member.name] += time.perf_counter() - started
    return {name: node.address for name, node in plan.nodes.items()}, list(seconds.values())


def remove_overlay(status, iface: str, names) -> None:
    from clusters.provisioning import overlay
    from inventory.drivers.sudo import SudoDriver

    for name in names:
        with SudoDriver(machine_driver(status, name)) as driver:
            overlay.remove(driver, iface)


def busbw(number: int, base: Path, status, topo, python: str, rounds: int, mb: int, iters: int) -> dict:
    from clusters.provisioning.overlay import Member

    nw = {n: topo.machine(n) for n in ("nw-01", "nw-02", "nw-03")}
    # Each its own "network" so the plan cannot go direct: the overlay dials the other's address; in the
    # relay case neither may dial the other, and nw-03 forwards.
    pair = [Member(n, f"net-{n}", nw[n].address, f"{nw[n].address}:51830", 51830) for n in ("nw-01", "nw-02")]
    relayed = [Member("nw-01", "net-1", nw["nw-01"].address, "", 51831),
               Member("nw-02", "net-2", nw["nw-02"].address, "", 51831),
               Member("nw-03", "net-3", nw["nw-03"].address, f"{nw['nw-03'].address}:51831", 51831)]  # fmt: skip
    over, setup_a = make_overlay(status, "vo801", "100.96.201.0/24", pair)
    via, setup_b = make_overlay(status, "vo802", "100.96.202.0/24", relayed)
    cases = {
        "direct": (nw["nw-01"].address, nw["nw-02"].address),
        "overlay": (over["nw-01"], over["nw-02"]),
        "relay": (via["nw-01"], via["nw-02"]),
    }
    figures: dict[str, list[float]] = {case: [] for case in cases}
    order = list(cases)
    try:
        probe(number, base, python, cases["relay"], 1, 2)  # the relay's handshakes, before anything is timed
        for r in range(rounds):
            for case in order[r % 3 :] + order[: r % 3]:
                figures[case].append(probe(number, base, python, cases[case], mb, iters))
                print(f"round {r + 1}: {case} {figures[case][-1] * 1000:.1f} MB/s", flush=True)
    finally:
        remove_overlay(status, "vo801", ("nw-01", "nw-02"))
        remove_overlay(status, "vo802", ("nw-01", "nw-02", "nw-03"))
    medians = {case: statistics.median(values) for case, values in figures.items()}
    return {
        "direct_gbps": round(medians["direct"], 4),
        "overlay_gbps": round(medians["overlay"], 4),
        "relay_gbps": round(medians["relay"], 4),
        "overlay_ratio": round(medians["overlay"] / medians["direct"], 3),
        "relay_ratio": round(medians["relay"] / medians["direct"], 3),
        "setup_s_per_node": round(statistics.median(setup_a + setup_b), 2),
        "each": {case: [round(v, 4) for v in values] for case, values in figures.items()},
    }


def cross_provider_ready(status, topo, scale: float) -> tuple[float, str]:
    """Seconds from request to READY, and the Python of Volt's runtime the machines now have."""
    from decimal import Decimal

    from django.contrib.auth import get_user_model

    from bench.provisioning import volt_run
    from inventory import reachability, runtimes, services
    from voltweb import services as accounts

    owners = get_user_model().objects
    site = services.get_or_create_site("iad1", "us-east", 12.5 * scale)
    hosts = []
    for provider_name, fabric_name, kind, rate, names in (
        ("Northwind", "iad1-ndr", "ib_ndr", 400.0, ("nw-01", "nw-02")),
        ("Helios", "ord1-roce", "roce", 200.0, ("he-01", "he-02")),
    ):
        owner = owners.create_user(f"bench-{provider_name.lower()}")
        provider = services.review_provider(services.register_provider(owner, provider_name), approve=True)
        fabric = services.create_fabric(provider, site, fabric_name, kind, rate * scale, 1.0, ["r1"])
        for name in names:
            machine = status.machine(name)
            request = services.HostRequest(
                name=name, block=fabric.blocks.get(), driver="ssh", price_per_gpu_hour=Decimal("2.00"),
                address=machine.gate, ssh_port=machine.gate_port, ssh_user=status.login_user,
                ssh_private_key=status.key_path.read_text(), private_address=machine.address,
                overlay_endpoint=topo.machine(name).udp_endpoint,
            )  # fmt: skip
            host = services.onboard_host(services.add_host(provider, request, queue=False).pk)
            if host.state != "available":
                raise SystemExit(f"{name}: onboarding failed: {host.error_message}")
            reachability.check(host)
            host = runtimes.install_runtime(host.pk)
            if host.runtime.get("state") != "ready":
                raise SystemExit(f"{name}: runtime {host.runtime}")
            hosts.append(host)
    researcher = owners.create_user("bench-researcher")
    accounts.add_member(accounts.create_team("Bench", "bench"), researcher)
    run = volt_run(4)
    return run["seconds"], hosts[0].runtime["python"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", type=int, default=91)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mb", type=int, default=8, help="the probe's largest message, MB")
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/overlay.py makes network, mount and PID namespaces: run it as root (sudo)")
    with tempfile.TemporaryDirectory(prefix="volt-bench-overlay-") as workdir:
        setup(Path(workdir))
        from django.conf import settings

        from inventory.lab import operations

        declared = Path(workdir) / "topology.json"
        declared.write_text(json.dumps(topology()))
        lab(args.lab, "up", "--topology", str(declared))
        base = Path(settings.VOLT_LAB_DIR)
        try:
            status = operations.status(base, args.lab)
            record, topo = operations.read_lab(base, args.lab)
            block_rate = topo.rate_bytes(topo.machine("nw-01"), topo.machine("nw-02"), record.scale)
            ready_s, python = cross_provider_ready(status, topo, record.scale)
            print(f"cross-provider READY in {ready_s:.1f} s", flush=True)
            figures = busbw(args.lab, base, status, topo, python, args.rounds, args.mb, args.iters)
        finally:
            lab(args.lab, "down")
            from inventory import tunnels

            tunnels.close_all()
    rows = [{"path": case, "busbw_mb_s": round(figures[f"{case}_gbps"] * 1000, 1)}
            for case in ("direct", "overlay", "relay")]  # fmt: skip
    print_table(rows, ["path", "busbw_mb_s"])
    print(f"block rate {block_rate / 1e6:.1f} MB/s; overlay/direct {figures['overlay_ratio']} (target 0.8); "
          f"set-up {figures['setup_s_per_node']} s per node; cross-provider READY {ready_s:.1f} s")  # fmt: skip
    emit_json({"bench": "overlay", **figures, "cross_provider_ready_s": round(ready_s, 1),
               "block_rate_mb_s": round(block_rate / 1e6, 1), "target_overlay_ratio": 0.8,
               "met": figures["overlay_ratio"] >= 0.8, "rounds": args.rounds, "max_mb": args.mb,
               "load_avg_1m": round(os.getloadavg()[0], 1)})  # fmt: skip


if __name__ == "__main__":
    main()
