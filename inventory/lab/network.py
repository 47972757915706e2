"""The lab's networks: namespaces, a bridge per provider in the router namespace, a veth per machine,
shaped with tc.

    root namespace            (no lab address, no lab route, no lab interface)
    volt-lab<N>-router        br1 10.77.1.1/24 ─┬─ vm1 ══ eth0 10.77.1.11  volt-lab<N>-nw-01
                              br2 10.77.2.1/24  ├─ vm2 ══ eth0 10.77.1.12  volt-lab<N>-nw-02
                              (forwards between └─ …
                               providers)       ─── vm5 ══ eth0 10.77.2.11  volt-lab<N>-he-01

Every command runs inside a lab namespace (`ip -n`), and a veth is made with each end already in its
namespace, so no lab interface or address ever appears in the root namespace. A machine's link is
shaped on the router's end of its veth (egress: what the machine receives), one HTB class per other
machine, matched on the sender's address, at the rate of the finest level the two share; traffic from the
router itself (the gates' SSH) is not classified and passes at full speed. Machines cannot change it: the
router's end is not in their namespace. Unplugging a machine sets the router's end down, as pulling its
cable at the switch would.

A NAT'd provider (topology.py) gets, in the router namespace, what its own NAT gateway would do, written as
nftables rules (`nat_ruleset`): its public address on the router's lo; DNAT from that address's forwarded
ports to each machine's sshd and overlay port (for connections arriving and for the gates' own); SNAT of
whatever its machines send out of their network; and a forward rule that drops every new connection from
outside its network to a private address in it. The router stays every provider's gateway: one namespace
plays each provider's NAT box and the internet between them, and a routed provider's machines stay
reachable on their private addresses, as before.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from inventory.lab.topology import CONTROL_ADDRESS, OVERLAY_PORT, SSH_PORT, Machine, Provider, Topology

NETNS_DIR = Path("/run/netns")
PREFIX = "volt-lab"
MACHINE_DEVICE = "eth0"
QUEUE_PACKETS = 1000


class NetworkError(RuntimeError):
    """An `ip` or `tc` command failed; the message has the command and what it printed."""


def router_namespace(lab: int) -> str:
    return f"{PREFIX}{lab}-router"


def machine_namespace(lab: int, machine: str) -> str:
    return f"{PREFIX}{lab}-{machine}"


def bridge(provider: Provider) -> str:
    return f"br{provider.ordinal}"


def router_end(machine: Machine) -> str:
    return f"vm{machine.ordinal}"


def _run(argv: Sequence[str], check: bool = True, input_text: str | None = None) -> str:
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=60, input=input_text)
    if check and result.returncode != 0:
        raise NetworkError(f"{' '.join(argv)}: {(result.stderr or result.stdout).strip()[:400]}")
    return result.stdout


def _ip(namespace: str, *args: str, check: bool = True) -> str:
    return _run(["ip", "-n", namespace, *args], check=check)


# --- namespaces ---------------------------------------------------------------------------------


def namespaces(lab: int) -> list[str]:
    """The namespaces of lab `lab` that exist now, found by name (whatever the state file says)."""
    prefix = f"{PREFIX}{lab}-"
    listed = _run(["ip", "netns", "list"], check=False).splitlines()
    return sorted(line.split()[0] for line in listed if line.split() and line.split()[0].startswith(prefix))


def add_namespace(name: str) -> None:
    _run(["ip", "netns", "add", name])
    _ip(name, "link", "set", "lo", "up")


def delete_namespace(name: str) -> None:
    """Delete a namespace (its interfaces go with it; a veth's other end too)."""
    _run(["ip", "netns", "delete", name], check=False)
    if (NETNS_DIR / name).exists():
        raise NetworkError(f"namespace {name} is still there after `ip netns delete {name}`")


def pids(name: str) -> list[int]:
    """Every process whose network namespace is `name`: all of them were started in the lab."""
    return [int(p) for p in _run(["ip", "netns", "pids", name], check=False).split() if p.isdigit()]


def run_netns_is_mounted() -> bool:
    """Whether /run/netns is a mount point (`ip netns add` makes it one the first time)."""
    target = str(NETNS_DIR)
    return any(line.split()[4] == target for line in Path("/proc/self/mountinfo").read_text().splitlines())


def unmount_run_netns_if_empty() -> None:
    """Undo the /run/netns mount `ip netns add` made, when no namespace is left in it."""
    if NETNS_DIR.is_dir() and not any(NETNS_DIR.iterdir()) and run_netns_is_mounted():
        _run(["umount", str(NETNS_DIR)], check=False)


# --- the router and the machines' links ---------------------------------------------------------


def make_router(lab: int, providers: Sequence[Provider]) -> None:
    """The router namespace's bridges, one per provider network, with forwarding between them."""
    router = router_namespace(lab)
    _run(["ip", "netns", "exec", router, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])
    for provider in providers:
        prefix = provider.network.split("/")[1]
        _ip(router, "link", "add", bridge(provider), "type", "bridge")
        _ip(router, "addr", "add", f"{provider.gateway}/{prefix}", "dev", bridge(provider))
        _ip(router, "link", "set", bridge(provider), "up")
    # Where control machines reach the control plane's services (the gate's back routes listen there): an
    # address of the router's own loopback (no dummy interfaces in every kernel), routed to like any other.
    _ip(router, "addr", "add", f"{CONTROL_ADDRESS}/32", "dev", "lo")
    for provider in providers:
        if provider.nat:
            _ip(router, "addr", "add", f"{provider.public_address}/32", "dev", "lo")


NAT_TABLE = "volt_lab_nat"
FILTER_TABLE = "volt_lab_filter"


def nat_ruleset(topology: Topology) -> str:
    """The nftables rules of every NAT'd provider's gateway ("" when no provider is NAT'd)."""
    natted = [p for p in topology.providers if p.nat]
    if not natted:
        return ""
    forwards: list[str] = []
    for machine in topology.machines:
        if not machine.public_address:
            continue
        forwards.append(
            f"ip daddr {machine.public_address} tcp dport {machine.public_ssh_port} "
            f"dnat to {machine.address}:{SSH_PORT}"
        )
        if machine.public_udp_port:
            forwards.append(
                f"ip daddr {machine.public_address} udp dport {machine.public_udp_port} "
                f"dnat to {machine.address}:{OVERLAY_PORT}"
            )
    snat = [f"ip saddr {p.network} ip daddr != {p.network} snat to {p.public_address}" for p in natted]
    drop = [f"ip daddr {p.network} ip saddr != {p.network} drop" for p in natted]

    def chain(name: str, hook: str, priority: str, rules: list[str]) -> list[str]:
        head = f"    type {hook.split()[0]} hook {hook.split()[1]} priority {priority}; policy accept;"
        return [f"  chain {name} {{", head, *(f"    {rule}" for rule in rules), "  }"]

    lines = [
        f"table ip {NAT_TABLE} {{",
        *chain("prerouting", "nat prerouting", "dstnat", forwards),
        *chain("output", "nat output", "-100", forwards),  # the gate's own connections
        *chain("postrouting", "nat postrouting", "srcnat", snat),
        "}",
        f"table ip {FILTER_TABLE} {{",
        *chain("forward", "filter forward", "filter", ["ct state established,related accept",
                                                       "ct status dnat accept", *drop]),
        "}",
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def apply_nat(lab: int, topology: Topology) -> None:
    """Load `nat_ruleset` into the router namespace (nothing when no provider is NAT'd)."""
    rules = nat_ruleset(topology)
    if rules:
        _run(["ip", "netns", "exec", router_namespace(lab), "nft", "-f", "-"], input_text=rules)


def link_machine(lab: int, machine: Machine, provider: Provider) -> None:
    """A veth from the router's bridge to the machine's eth0, with its address and a default route."""
    router, own = router_namespace(lab), machine_namespace(lab, machine.name)
    prefix = provider.network.split("/")[1]
    end = router_end(machine)
    _ip(router, "link", "add", end, "type", "veth", "peer", "name", MACHINE_DEVICE, "netns", own)
    _ip(router, "link", "set", end, "alias", machine.name, "txqueuelen", str(QUEUE_PACKETS))
    _ip(router, "link", "set", end, "master", bridge(provider))
    _ip(router, "link", "set", end, "up")
    _ip(own, "addr", "add", f"{machine.address}/{prefix}", "dev", MACHINE_DEVICE)
    _ip(own, "link", "set", MACHINE_DEVICE, "txqueuelen", str(QUEUE_PACKETS), "up")
    _ip(own, "route", "add", "default", "via", provider.gateway)


def drop_connections(lab: int, name: str) -> None:
    """Destroy every TCP socket of machine `name`'s namespace (`ss -K`). Its processes gone, the kernel would
    still send what their closed sockets had queued (and FIN it: a complete upload from a machine without
    power); a real machine's power-off takes that too. Peers get a reset."""
    _run(["ip", "netns", "exec", machine_namespace(lab, name), "ss", "-K", "-t", "-a"], check=False)


def set_plugged(lab: int, machine: Machine, plugged: bool) -> None:
    """Plug or unplug a machine's cable: its veth's router end up or down."""
    _ip(router_namespace(lab), "link", "set", router_end(machine), "up" if plugged else "down")


# --- shaping ------------------------------------------------------------------------------------


def _rate(rate_bytes: int) -> str:
    # A small bucket keeps a transfer honest at low rates (as the emulated fabric's classes on lo do);
    # veths hand over 64 KB GSO packets, so the bucket holds at least one.
    burst = max(rate_bytes // 500, 70_000)
    return f"rate {rate_bytes * 8}bit ceil {rate_bytes * 8}bit burst {burst} cburst {burst}"


def shaping_plan(topology: Topology, scale: float) -> dict[str, list[tuple[str, int]]]:
    """For each machine, (sender's address, bytes/s) for every other machine: what its link lets in."""
    return {
        dst.name: [
            (src.address, topology.rate_bytes(src, dst, scale)) for src in topology.machines if src != dst
        ]
        for dst in topology.machines
    }


def shape(lab: int, topology: Topology, scale: float) -> None:
    """Shape every machine's link: an HTB root on the router's end, a class and a u32 filter per sender."""
    router = router_namespace(lab)
    plan = shaping_plan(topology, scale)
    lines: list[str] = []
    for machine in topology.machines:
        dev = router_end(machine)
        lines.append(f"qdisc replace dev {dev} root handle 1: htb")  # no default class: the rest goes direct
        for k, (source, rate_bytes) in enumerate(plan[machine.name], start=1):
            lines.append(f"class add dev {dev} parent 1: classid 1:{k:x} htb {_rate(rate_bytes)}")
            lines.append(f"qdisc add dev {dev} parent 1:{k:x} handle {k + 1:x}: pfifo limit {QUEUE_PACKETS}")
            lines.append(
                f"filter add dev {dev} parent 1: protocol ip prio 1 u32 match ip src {source}/32 flowid 1:{k:x}"
            )
    _run(["ip", "netns", "exec", router, "tc", "-batch", "-"], input_text="\n".join(lines) + "\n")
