"""A cluster's own WireGuard overlay, for nodes that cannot all reach each other: DESIGN.md "Networks between
hosts", issue 26.

One interface per cluster on each of its hosts (`vo<cluster number>`), an address per node from the
cluster's own range, a key pair per cluster and node whose private half is made on its host (`wg genkey`
there) and never leaves it: Volt reads back the public key alone. Peers are written as a `wg syncconf`
file on each host, so adding a replacement or removing a dead node changes the survivors' peers without
touching their interface or their running Ray.

How a node reaches a peer (`plan`):

- same network (same provider network: each reaches the other's private address) → the peer's private
  address and overlay port;
- otherwise the peer's public endpoint (the UDP port its provider forwards), if it has one;
- otherwise, if this node has a public endpoint, no endpoint: the peer dials in (it keeps the NAT's
  mapping open with a keepalive) and WireGuard answers where the handshake came from;
- otherwise neither can be dialled: both go through the relay, a node every other can reach, which
  forwards between them (their addresses are routed through its peer entry on both sides).

Kernel WireGuard where the host has it (`ip link add … type wireguard`), else `wireguard-go` (userspace,
over /dev/net/tun); both are configured by `wg`. Host commands run as root (the cluster's sudo driver).
Pure Python over a host driver, like node_firewall.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from inventory.drivers.base import DriverError, HostDriver

OVERLAY_POOL = ipaddress.ip_network("100.96.0.0/12")  # carrier-grade NAT space: /24 per live cluster
CLUSTER_PREFIX = 24
DEFAULT_PORT = 51820
MTU = 1420  # 1500 less WireGuard's 80 bytes of IPv6 + UDP + header, as wg-quick picks
KEEPALIVE_S = 25
KEY_DIR = "/etc/volt/overlay"
NO_WG = "VOLT_NO_WG"
_INTERFACE = re.compile(r"^vo[0-9]{1,12}$")
_KEY = re.compile(r"^[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]=$")  # 32 bytes, base64
DIRECT, OVERLAY, RELAY = "direct", "overlay", "relay"


class OverlayFailed(DriverError):
    """The overlay could not be set up or changed on a host (its output says why)."""

    code = "overlay_failed"


@dataclass(frozen=True)
class Member:
    """A node as the overlay plans it: where its peers find it."""

    name: str
    network: str  # its provider network's name: members of one network reach each other's private address
    private_address: str
    endpoint: str = ""  # "ADDRESS:PORT" where other networks reach its overlay port ("" when none does)
    port: int = DEFAULT_PORT  # the UDP port its interface listens on


@dataclass(frozen=True)
class Peer:
    name: str
    public_key: str
    endpoint: str  # "" when the peer dials in
    allowed_ips: tuple[str, ...]
    keepalive: bool  # this side keeps a NAT mapping open toward the peer


@dataclass(frozen=True)
class NodePlan:
    name: str
    address: str
    port: int
    peers: tuple[Peer, ...]
    forwards: bool = False  # the relay: forwards between peers that cannot dial each other


@dataclass(frozen=True)
class Plan:
    network: str  # the cluster's range
    nodes: dict[str, NodePlan]
    paths: dict[tuple[str, str], str] = field(default_factory=dict)  # (a, b) sorted → direct/overlay/relay
    relay: str = ""

    @property
    def path(self) -> str:
        """The cluster's path as the plan names it: relay if any pair goes through it, else overlay."""
        return RELAY if RELAY in self.paths.values() else OVERLAY


def interface(cluster_number: int) -> str:
    return f"vo{int(cluster_number)}"


def cluster_network(taken: Iterable[str]) -> str:
    """The first /24 of the pool no live cluster holds (`taken`: their ranges)."""
    used = set(taken)
    for subnet in OVERLAY_POOL.subnets(new_prefix=CLUSTER_PREFIX):
        if str(subnet) not in used:
            return str(subnet)
    raise OverlayFailed(f"every overlay range of {OVERLAY_POOL} is taken by a live cluster")


def needs_overlay(members: Sequence[Member]) -> bool:
    """Whether some pair of members sits in different networks (the rest reach each other directly)."""
    return len({m.network for m in members}) > 1


def pair_path(a: Member, b: Member) -> str:
    if a.network == b.network:
        return DIRECT
    return OVERLAY if (a.endpoint or b.endpoint) else RELAY


def choose_relay(members: Sequence[Member]) -> str:
    """The member every pair that cannot dial each other can reach: one with a public endpoint ("" when no
    pair needs a relay). Raises OverlayFailed when some pair needs one and no member can be it."""
    stuck = [(a, b) for i, a in enumerate(members) for b in members[i + 1 :] if pair_path(a, b) == RELAY]
    if not stuck:
        return ""
    for candidate in members:
        if candidate.endpoint:
            return candidate.name
    names = sorted({m.name for pair in stuck for m in pair})
    raise OverlayFailed(
        f"{', '.join(names)} have no reachable UDP endpoint and no node of this cluster has one to relay "
        "through: ask a provider to forward a UDP port to its hosts, or add a host that has one"
    )


@dataclass(frozen=True)
class Route:
    """How a cluster's nodes will reach each other, before any key exists: what placement predicts from."""

    path: str  # DIRECT, OVERLAY or RELAY
    relay: str  # the relay's name ("" when no pair needs one)
    paths: dict[tuple[str, str], str]  # (a, b) sorted → DIRECT / OVERLAY / RELAY
    networks: int  # how many networks the nodes sit in


def route(members: Sequence[Member]) -> Route:
    """The path `plan` would set up for these members. Raises OverlayFailed when a pair needs a relay and no
    member can be it."""
    paths = {
        tuple(sorted((a.name, b.name))): pair_path(a, b)
        for i, a in enumerate(members)
        for b in members[i + 1 :]
    }
    count = len({m.network for m in members})
    if count <= 1:
        return Route(DIRECT, "", paths, count)
    relay = choose_relay(members)
    return Route(RELAY if RELAY in paths.values() else OVERLAY, relay, paths, count)


def plan(
    members: Sequence[Member],
    public_keys: Mapping[str, str],
    network: str,
    kept: Mapping[str, str] | None = None,
) -> Plan:
    """Every node's address, port and peers. `kept`: addresses nodes already have (a survivor's Ray is bound
    to its own); the others take the lowest free ones, from .1."""
    _check_keys(public_keys, members)
    net = ipaddress.ip_network(network)
    address = {name: ip for name, ip in (kept or {}).items() if name in {m.name for m in members}}
    free = (str(ip) for ip in net.hosts() if str(ip) not in set(address.values()))
    for member in members:
        if member.name not in address:
            address[member.name] = next(free, "")
            if not address[member.name]:
                raise OverlayFailed(f"{len(members)} nodes do not fit in {network}")
    routed = route(members)
    relay, paths = routed.relay, routed.paths
    nodes = {}
    for me in members:
        routed_via_relay = [
            other.name
            for other in members
            if other is not me and paths[tuple(sorted((me.name, other.name)))] == RELAY
        ]
        peers = []
        for other in members:
            if other is me or other.name in routed_via_relay:
                continue
            allowed = [f"{address[other.name]}/32"]
            if other.name == relay:
                allowed += [f"{address[n]}/32" for n in routed_via_relay]
            peers.append(
                Peer(
                    name=other.name,
                    public_key=public_keys[other.name],
                    endpoint=_endpoint(me, other),
                    allowed_ips=tuple(allowed),
                    keepalive=me.network != other.network and not me.endpoint,
                )
            )
        nodes[me.name] = NodePlan(me.name, address[me.name], me.port, tuple(peers), forwards=me.name == relay)
    return Plan(network=str(net), nodes=nodes, paths=paths, relay=relay)


def _endpoint(me: Member, other: Member) -> str:
    if me.network == other.network:
        return f"{other.private_address}:{other.port}"
    return other.endpoint  # "" when it has none: it dials in


def _check_keys(public_keys: Mapping[str, str], members: Sequence[Member]) -> None:
    names = [m.name for m in members]
    if len(set(names)) != len(names):
        raise OverlayFailed(f"node names repeat: {', '.join(names)}")
    for name in names:
        if not _KEY.match(public_keys.get(name, "")):
            raise OverlayFailed(f"{name}: {public_keys.get(name)!r} is not a WireGuard public key")


def config(node: NodePlan) -> str:
    """The node's `wg syncconf` file; `apply` puts the host's own private key in place of @KEY@ on the host."""
    lines = ["[Interface]", f"ListenPort = {node.port}", "PrivateKey = @KEY@"]
    for peer in node.peers:
        lines += [
            "",
            "[Peer]",
            f"PublicKey = {peer.public_key}",
            f"AllowedIPs = {', '.join(peer.allowed_ips)}",
        ]
        if peer.endpoint:
            lines.append(f"Endpoint = {peer.endpoint}")
        if peer.keepalive:
            lines.append(f"PersistentKeepalive = {KEEPALIVE_S}")
    return "\n".join(lines) + "\n"


# --- on a host ----------------------------------------------------------------------------------


def _paths(iface: str) -> tuple[str, str]:
    if not _INTERFACE.match(iface):
        raise ValueError(f"{iface!r} is not an overlay interface name")
    return f"{KEY_DIR}/{iface}.key", f"{KEY_DIR}/{iface}.conf"


def _run(driver: HostDriver, script: str, what: str, timeout: float) -> str:
    result = driver.run(script, timeout=timeout)
    if NO_WG in result.stdout:
        raise OverlayFailed(
            f"{driver.address} has no `wg`: install wireguard-tools (and wireguard-go where the kernel has no "
            "WireGuard module) on it, then retry"
        )
    if not result.ok:
        output = (result.stderr.strip() or result.stdout.strip())[-500:]
        raise OverlayFailed(f"could not {what} on {driver.address}: {output}")
    return result.stdout


_PREAMBLE = [
    'PATH="$PATH:/usr/sbin:/sbin"',
    "set -e",
    f"command -v wg >/dev/null 2>&1 || {{ echo {NO_WG}; exit 0; }}",
]


def make_key(driver: HostDriver, iface: str, timeout: float = 30) -> str:
    """The host's key pair for this interface, made there if missing (0600, root's); its public key."""
    key, _conf = _paths(iface)
    script = "\n".join(
        [
            *_PREAMBLE,
            "umask 077",
            f"mkdir -p {KEY_DIR}",
            f"[ -s {key} ] || wg genkey > {key}",
            f"wg pubkey < {key}",
        ]
    )
    public = _run(driver, script, "make the overlay's key", timeout).strip().splitlines()[-1:]
    if not public or not _KEY.match(public[0]):
        raise OverlayFailed(f"{driver.address}: `wg pubkey` printed {public!r}")
    return public[0]


def apply(
    driver: HostDriver, iface: str, node: NodePlan, prefix: int = CLUSTER_PREFIX, timeout: float = 60
) -> str:
    """Create the interface if missing (kernel WireGuard, else wireguard-go), give it its address, and set its
    peers to exactly the plan's (`wg syncconf`: peers added and removed, the interface left up). Returns
    "kernel" or "wireguard-go"."""
    key, conf = _paths(iface)
    body = config(node)
    script = "\n".join(
        [
            *_PREAMBLE,
            "umask 077",
            f"if ! ip link show {iface} >/dev/null 2>&1; then",
            f"  if ! ip link add {iface} type wireguard 2>/dev/null; then",
            "    command -v wireguard-go >/dev/null 2>&1 || { echo 'neither kernel WireGuard nor wireguard-go' >&2; exit 3; }",
            f"    wireguard-go {iface} >/dev/null 2>&1 </dev/null",
            "  fi",
            "fi",
            f"[ -e /sys/class/net/{iface}/tun_flags ] || echo VOLT_KERNEL  # a TUN device: wireguard-go's",
            f"cat > {conf}.new <<'VOLT_WG'",
            body.rstrip("\n"),
            "VOLT_WG",
            f'sed -i "s|@KEY@|$(cat {key})|" {conf}.new',
            f"mv {conf}.new {conf}",
            f"wg syncconf {iface} {conf}",
            f"ip address replace {node.address}/{prefix} dev {iface}",
            f"ip link set {iface} mtu {MTU} up",
            *([f"sysctl -q -w net.ipv4.conf.{iface}.forwarding=1"] if node.forwards else []),
            "echo VOLT_APPLIED",
        ]
    )
    out = _run(driver, script, "set up the overlay", timeout)
    if "VOLT_APPLIED" not in out:
        raise OverlayFailed(f"{driver.address}: the overlay's set-up stopped early: {out.strip()[-300:]}")
    return "kernel" if "VOLT_KERNEL" in out else "wireguard-go"


def remove(driver: HostDriver, iface: str, timeout: float = 30) -> None:
    """The interface (its address and route go with it; wireguard-go ends with it), its key and config.
    Idempotent."""
    key, conf = _paths(iface)
    script = "\n".join(
        [
            'PATH="$PATH:/usr/sbin:/sbin"',
            f"ip link delete {iface} 2>/dev/null || true",
            f"rm -f {key} {conf} {conf}.new",
            f"rm -f /var/run/wireguard/{iface}.sock",
            f"rmdir {KEY_DIR} 2>/dev/null && rmdir {KEY_DIR.rsplit('/', 1)[0]} 2>/dev/null || true",
            f"! ip link show {iface} >/dev/null 2>&1",
        ]
    )
    _run(driver, script, "remove the overlay", timeout)


def leftovers(driver: HostDriver, iface: str, timeout: float = 30) -> list[str]:
    """What of the interface is still on the host: its link, key or config file, a route through it."""
    key, conf = _paths(iface)
    script = "\n".join(
        [
            'PATH="$PATH:/usr/sbin:/sbin"',
            f"ip link show {iface} >/dev/null 2>&1 && echo link",
            f"for f in {key} {conf}; do [ -e $f ] && echo $f; done",
            f"ip route show dev {iface} 2>/dev/null | sed 's/^/route /'",
            "true",
        ]
    )
    return [line for line in driver.run(script, timeout=timeout).stdout.splitlines() if line.strip()]
