"""The level bandwidth / latency model (DESIGN.md "Topology model"). Pure Python.

Two hosts talk at the figure of their lowest common level. A hop at level L leaves each host
through every level below L too (its leaf switch, its fabric's spine...), so a host's *cap* at L is
the minimum of its figures from block up to L. A ring all-reduce runs at its slowest hop, so a
cluster's predicted busbw is the minimum, over its hosts, of their caps at the coarsest level the
cluster spans. (Conservative: every host is counted as if it sat on a boundary hop.)

Figures per level (GB/s), declared unless a measured sample overrides them:

| level  | declared figure                                | measured key          |
|--------|------------------------------------------------|-----------------------|
| block  | fabric per-host bandwidth, or the host's ports | ("block", block_id)   |
|        | where they give less (discovered_host_gbps)    |                       |
| fabric | per-host bandwidth / oversubscription          | ("fabric", fabric_id) |
| site   | site backbone (default 12.5 = 100 GbE)         | ("site", site_id)     |
| region | WAN inside a region, 10 Gb/s = 1.25            | ("region", region)    |
| global | WAN across regions, 1 Gb/s = 0.125             | ("global", "")        |

A measured value is an nccl-tests busbw in GB/s of the link class a probe exercised: the coarsest
level its cluster spanned, in that domain. It is applied as an *efficiency* (measured / declared) of
that domain: the figures of the domain's hosts at its level, and at every coarser level (their
traffic leaves through it), are scaled by it. Nothing beside it changes (other domains keep their
figures) and the hierarchy is never flattened: a slow block's hosts still rank in-block above
cross-block, and every level of theirs ranks below a healthy block's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from .types import LEVELS, FabricKind, HostSnapshot, Level

Measured = Mapping[tuple[str, str], float]

DEFAULT_SITE_BACKBONE_GBPS = 12.5  # 100 GbE between a site's fabrics
WAN_SAME_REGION_GBPS = 1.25  # 10 Gb/s between sites of one region
WAN_CROSS_REGION_GBPS = 0.125  # 1 Gb/s between regions

LEVEL_LATENCY_S: dict[str, float] = {
    Level.BLOCK: 2e-6,
    Level.FABRIC: 3e-6,
    Level.SITE: 50e-6,
    Level.REGION: 2e-3,
    Level.GLOBAL: 80e-3,  # DESIGN.md gives 30-150 ms between regions
}

# Typical declared per-host injection bandwidth by fabric kind (8 NICs for the fast fabrics), GB/s.
DECLARED_HOST_GBPS: dict[str, float] = {
    FabricKind.IB_NDR: 400.0,  # 8 x 400 Gb/s
    FabricKind.IB_HDR: 200.0,  # 8 x 200 Gb/s
    FabricKind.ROCE: 100.0,  # 8 x 100 Gb/s
    FabricKind.ETH_100G: 12.5,
    FabricKind.ETH_25G: 3.125,
    FabricKind.ETH_10G: 1.25,
}


def format_gbps(value: float | None, places: int = 1) -> str:
    """A bandwidth in GB/s that never rounds to 0.0: `places` fixed decimals from 0.1 GB/s up, two
    significant digits below. Emulated links run at the declared figures x VOLT_LOCAL_FABRIC_SCALE (a site
    backbone 0.003 GB/s), which fixed places printed as "0.0 GB/s". One rule for pages (the `gbps`
    filter), the timeline and the API's messages."""
    if value is None:
        return "—"
    number = float(value)
    if number == 0 or abs(number) >= 0.1:
        return f"{number:.{int(places)}f}"
    return f"{number:.2g}"


def measured_key(host: HostSnapshot, level: Level) -> tuple[str, str]:
    """The key a measured busbw sample for `host`'s domain at `level` is stored under."""
    path = host.path
    ids = {
        Level.BLOCK: path.block_id,
        Level.FABRIC: path.fabric_id,
        Level.SITE: path.site_id,
        Level.REGION: path.region,
        Level.GLOBAL: "",
    }
    return (str(level), ids[level])


def declared_figures_gbps(host: HostSnapshot) -> tuple[float, float, float, float, float]:
    """The figure of each level for `host` before measurement, finest first (times its bandwidth_scale).

    In-block it is the host's injection bandwidth: the fabric's declared per-host figure, or what its
    ports give where that is less (`HostSnapshot.injection_gbps`). Coarser levels keep their declared
    figures; the running minimum in `level_caps_gbps` carries a port shortfall up to them.
    """
    fabric = host.fabric_host_gbps / max(host.fabric_oversubscription, 1e-9)
    scale = host.bandwidth_scale
    return (
        host.injection_gbps * scale,
        fabric * scale,
        host.site_backbone_gbps * scale,
        WAN_SAME_REGION_GBPS * scale,
        WAN_CROSS_REGION_GBPS * scale,
    )


def efficiencies(host: HostSnapshot, measured: Measured | None) -> tuple[float, ...]:
    """Measured / declared for each of `host`'s domains, finest first (1.0 where nothing was measured)."""
    if not measured:
        return (1.0,) * len(LEVELS)
    declared = declared_figures_gbps(host)
    return tuple(
        measured[key] / figure if (key := measured_key(host, level)) in measured and figure > 0 else 1.0
        for level, figure in zip(LEVELS, declared, strict=True)
    )


def level_caps_gbps(host: HostSnapshot, measured: Measured | None = None) -> tuple[float, ...]:
    """`host`'s cap at each level, finest first: the running minimum of its declared figures, each
    scaled by the efficiencies measured for its domains at that level and every finer one."""
    caps: list[float] = []
    scale = 1.0
    for declared, efficiency in zip(declared_figures_gbps(host), efficiencies(host, measured), strict=True):
        scale *= efficiency
        figure = declared * scale
        caps.append(min(figure, caps[-1]) if caps else figure)
    return tuple(caps)


def lowest_common_level(hosts: Sequence[HostSnapshot]) -> Level | None:
    """The finest level one domain of which holds every host; None for fewer than two hosts."""
    if len(hosts) < 2:
        return None
    for level in LEVELS:
        first = hosts[0].path.domain(level)
        if all(host.path.domain(level) == first for host in hosts):
            return level
    return Level.GLOBAL


def cluster_busbw_gbps(hosts: Sequence[HostSnapshot], measured: Measured | None = None) -> float | None:
    """Predicted inter-node all-reduce busbw of `hosts` in GB/s; None for a single node."""
    level = lowest_common_level(hosts)
    if level is None:
        return None
    index = LEVELS.index(level)
    return min(level_caps_gbps(host, measured)[index] for host in hosts)


def busbw_from_algbw(algbw_gbps: float, nodes: int) -> float:
    """nccl-tests' all-reduce bus bandwidth: algbw * 2(n-1)/n."""
    return algbw_gbps * 2 * (nodes - 1) / nodes


def allreduce_seconds(nbytes: float, nodes: int, busbw_gbps: float, level: str) -> float:
    """Ring all-reduce time of `nbytes` over `nodes`: 2(n-1)/n * B / bw + 2(n-1) * latency(level)."""
    if nodes < 2:
        return 0.0
    transfer = 2 * (nodes - 1) / nodes * nbytes / (busbw_gbps * 1e9)
    return transfer + 2 * (nodes - 1) * LEVEL_LATENCY_S[level]


def hop_gbps(a: HostSnapshot, b: HostSnapshot, measured: Measured | None = None) -> tuple[Level, float]:
    """The level and bandwidth of the link between two hosts (used to explain pipeline hops)."""
    level = lowest_common_level((a, b)) or Level.BLOCK
    index = LEVELS.index(level)
    return level, min(level_caps_gbps(a, measured)[index], level_caps_gbps(b, measured)[index])


def describe_level_sources(hosts: Iterable[HostSnapshot], level: str, measured: Measured | None) -> str:
    """'measured' when a sample covers a domain of these hosts up to `level`, else 'declared'."""
    if not measured:
        return "declared"
    levels = LEVELS[: LEVELS.index(Level(level)) + 1]
    keys = {measured_key(host, lvl) for host in hosts for lvl in levels}
    return "measured" if keys & set(measured) else "declared"


def measured_notes(hosts: Iterable[HostSnapshot], measured: Measured | None) -> list[str]:
    """One line per measured figure that applies to these hosts: which domain, the figure, the
    efficiency it stands for. Every other figure of the plan is declared."""
    if not measured:
        return []
    lines: dict[tuple[str, str], str] = {}
    for host in hosts:
        for level, declared in zip(LEVELS, declared_figures_gbps(host), strict=True):
            key = measured_key(host, level)
            if key in measured and key not in lines and declared > 0:
                domain = "/".join(host.path.domain(level)) or "all regions"
                share = measured[key] / declared
                lines[key] = (
                    f"measured: {level} {domain} at {measured[key]:g} GB/s against {declared:g} GB/s declared "
                    f"(efficiency {share:.0%}, applied to that {level}'s hosts only)"
                )
    return [lines[key] for key in sorted(lines)]


def port_notes(hosts: Iterable[HostSnapshot]) -> list[str]:
    """One line per host whose ports give less than its fabric declares: the plan predicts from them."""
    lines = []
    for host in hosts:
        if host.injection_gbps < host.fabric_host_gbps:
            ports = host.injection_gbps * host.bandwidth_scale
            declared = host.fabric_host_gbps * host.bandwidth_scale
            lines.append(
                f"ports: host {host.host_id} injects {ports:g} GB/s through its ports, below the {declared:g} GB/s "
                f"its fabric declares per host: predicted from {ports:g} GB/s"
            )
    return lines
