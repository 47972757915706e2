"""NIC ports: read from /sys/class/infiniband where ibstat is absent, counted by transport, and checked
against the fabric the provider declared. Pure Python (no Django import).

The check is twofold: each port against the fabric's kind (transport, state, per-port rate), and the
host's ports together against the fabric's declared per-host bandwidth (`injection`: count x rate of the
ports up that carry the fabric's traffic, in GB/s). A host with one 200 Gb/s port injects 25 GB/s,
whatever its fabric declares; placement predicts from the smaller of the two figures.

`SYSFS_COMMAND` runs on the host through its driver. It reads `${VOLT_HOST_ROOT}/sys/class/infiniband`
(VOLT_HOST_ROOT is unset on real hosts; a `local` sandbox or test host lays its tree out there) and
prints, per port::

    port: /sys/class/infiniband/mlx5_0/ports/1
    state: 4: ACTIVE
    phys_state: 5: LinkUp
    rate: 400 Gb/sec (4X NDR)
    link_layer: InfiniBand
    gid_types: IB/RoCE v1;RoCE v2;

`gid_types` is what tells a RoCE port (RDMA GIDs) from plain Ethernet on the same kind of NIC.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, replace

from inventory.discovery.types import IbPort, ParseError

SYSFS_COMMAND = (
    'R="${VOLT_HOST_ROOT:-}/sys/class/infiniband"; for p in "$R"/*/ports/*; do [ -d "$p" ] || continue; '
    'echo "port: $p"; for f in state phys_state rate link_layer; do printf "%s: " "$f"; '
    'cat "$p/$f" 2>/dev/null || echo; done; printf "gid_types: "; '
    "cat \"$p\"/gid_attrs/types/* 2>/dev/null | sort -u | tr '\\n' ';'; echo; done"
)
_PORT_PATH = re.compile(r"/([^/]+)/ports/(\d+)$")
_STATES = {"ACTIVE": "Active", "DOWN": "Down", "INIT": "Initializing", "ARMED": "Armed"}
_RATE = re.compile(r"^(\d+(?:\.\d+)?)\s*Gb/sec")
# Per-port signalling rate a declared InfiniBand fabric implies (Gb/s).
DECLARED_PORT_RATE_GBPS = {"ib_ndr": 400, "ib_hdr": 200}
_FABRIC_TRANSPORT = {"ib_ndr": "infiniband", "ib_hdr": "infiniband", "roce": "roce"}
# The ports that carry a fabric's traffic: an Ethernet fabric runs over any Ethernet port, RDMA or not.
FABRIC_PORT_TRANSPORTS = {
    "ib_ndr": ("infiniband",),
    "ib_hdr": ("infiniband",),
    "roce": ("roce",),
    "eth_100g": ("ethernet", "roce"),
    "eth_25g": ("ethernet", "roce"),
    "eth_10g": ("ethernet", "roce"),
}
_TRANSPORT_LABELS = {"infiniband": "InfiniBand", "roce": "RoCE", "ethernet": "Ethernet"}
_SHORTFALL_TOLERANCE = 1e-6  # GB/s: 8 x 400 Gb/s is exactly 400 GB/s


def _value(text: str) -> str:
    """ "4: ACTIVE" -> "ACTIVE"; "InfiniBand" -> "InfiniBand"."""
    return text.split(":", 1)[1].strip() if re.match(r"^\d+:", text) else text.strip()


def _sysfs_port(path: str, values: dict[str, str]) -> IbPort:
    match = _PORT_PATH.search(path)
    rate = _RATE.match(values.get("rate", ""))
    if not match or not rate or "state" not in values:
        raise ParseError(f"/sys/class/infiniband: expected state and a rate like '400 Gb/sec' for {path}")
    state = _value(values["state"])
    return IbPort(
        ca=match.group(1),
        port=int(match.group(2)),
        state=_STATES.get(state.upper(), state.title()),
        physical_state=_value(values.get("phys_state", "")),
        rate_gbps=round(float(rate.group(1))),
        link_layer=values.get("link_layer", "").strip() or "InfiniBand",
        roce="RoCE" in values.get("gid_types", ""),
        source="sysfs",
    )


def parse_sysfs_ports(text: str) -> tuple[IbPort, ...]:
    """Parse SYSFS_COMMAND's output into ports, in printed order (empty: no RDMA device)."""
    blocks: list[tuple[str, dict[str, str]]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        key, sep, value = raw.partition(": ")
        if not raw.strip():
            continue
        if not sep and raw.rstrip().endswith(":"):
            key, value = raw.rstrip()[:-1], ""
        elif not sep:
            raise ParseError(
                f"/sys/class/infiniband: expected 'key: value', saw line {number}: {raw[:160]!r}"
            )
        if key == "port":
            blocks.append((value.strip(), {}))
        elif blocks:
            blocks[-1][1][key] = value
    return tuple(_sysfs_port(path, values) for path, values in blocks)


def with_roce_flags(ports: tuple[IbPort, ...], sysfs_ports: tuple[IbPort, ...]) -> tuple[IbPort, ...]:
    """ibstat's ports, each Ethernet one marked RoCE or not from the sysfs GID types of the same port."""
    roce = {(p.ca, p.port): p.roce for p in sysfs_ports}
    return tuple(replace(p, roce=roce.get((p.ca, p.port))) for p in ports)


def port_counts(ports: tuple[IbPort, ...]) -> dict[str, int]:
    """Ports up per transport: {"infiniband": 8, "roce": 0, "ethernet": 1}."""
    counts = Counter(p.transport for p in ports if p.is_up)
    return {kind: counts.get(kind, 0) for kind in ("infiniband", "roce", "ethernet")}


@dataclass(frozen=True)
class Injection:
    """What a host's ports can put on its fabric: `gbytes_per_s` (count x rate of the ports counted, GB/s;
    None when no port is up), which ports those are in words, and whether they are the fabric's own."""

    gbytes_per_s: float | None
    ports: str  # "1 x 200 Gb/s InfiniBand", "8 x 400 Gb/s InfiniBand", "" when none
    fallback: bool = False  # no port of the fabric's transport is up: the others carry its traffic


def injection(fabric_kind: str, ports: tuple[IbPort, ...]) -> Injection:
    """The host's injection bandwidth on a fabric of `fabric_kind`, from its ports that are up.

    The fabric's own transport counts (InfiniBand for IB fabrics, RoCE for RoCE, any Ethernet port for
    Ethernet fabrics). Where none of those is up, the ports that are up still carry the traffic (NCCL falls
    back to sockets over them), so they count instead (`fallback`). None when no port is up at all: the
    discovery tools list RDMA-capable NICs only, so a plain Ethernet NIC is invisible and nothing is known.
    """
    wanted = FABRIC_PORT_TRANSPORTS.get(fabric_kind, ())
    up = [p for p in ports if p.is_up]
    counted = [p for p in up if p.transport in wanted]
    fallback = not counted and bool(up)
    counted = counted or up
    if not counted:
        return Injection(None, "")
    rates = Counter((p.rate_gbps, p.transport) for p in counted)
    words = " + ".join(
        f"{n} x {rate} Gb/s {_TRANSPORT_LABELS.get(kind, kind)}" for (rate, kind), n in sorted(rates.items())
    )
    return Injection(sum(p.rate_gbps for p in counted) / 8, words, fallback)


def shortfall_warning(fabric_label: str, declared_gbytes_per_s: float, found: Injection) -> str:
    """A warning when the ports give less than the fabric declares per host ("" when they give enough)."""
    figure = found.gbytes_per_s
    if figure is None or figure + _SHORTFALL_TOLERANCE >= declared_gbytes_per_s:
        return ""
    instead = " (none of the fabric's own ports is up)" if found.fallback else ""
    return (
        f"the ports give {figure:g} GB/s per host ({found.ports}){instead}, below the "
        f"{declared_gbytes_per_s:g} GB/s the fabric {fabric_label} declares per host: placement predicts "
        f"from {figure:g} GB/s"
    )


def fabric_warnings(
    fabric_kind: str,
    fabric_label: str,
    ports: tuple[IbPort, ...],
    declared_gbytes_per_s: float | None = None,
) -> list[str]:
    """Where the discovered ports contradict the declared fabric (empty when they agree).

    An InfiniBand fabric needs InfiniBand ports, up, at its rate (NDR 400, HDR 200 Gb/s); a RoCE
    fabric needs RoCE ports, up; an Ethernet fabric an Ethernet port up. Plain Ethernet ports
    (management) are never held against an InfiniBand or RoCE fabric. With `declared_gbytes_per_s`, the
    ports together must give the fabric's per-host bandwidth (`injection`), Ethernet fabrics included.
    """
    warnings = _port_warnings(fabric_kind, fabric_label, ports)
    if declared_gbytes_per_s:
        found = injection(fabric_kind, ports)
        shortfall = shortfall_warning(fabric_label, declared_gbytes_per_s, found)
        warnings += [shortfall] if shortfall else []
    return warnings


def _port_warnings(fabric_kind: str, fabric_label: str, ports: tuple[IbPort, ...]) -> list[str]:
    transport = _FABRIC_TRANSPORT.get(fabric_kind)
    if transport is None:
        return _ethernet_warnings(fabric_kind, fabric_label, ports)
    mine = [p for p in ports if p.transport == transport]
    kind_label = "InfiniBand" if transport == "infiniband" else "RoCE"
    if not mine:
        others = Counter(p.transport for p in ports)
        seen = ", ".join(f"{n} {t}" for t, n in sorted(others.items())) or "no RDMA port at all"
        return [f"the fabric is declared {fabric_label} but this host has no {kind_label} port ({seen})"]
    warnings = [
        f"{p.ca} port {p.port} is {p.state} ({p.physical_state or 'no link'}); the fabric is declared {fabric_label}"
        for p in mine
        if not p.is_up
    ]
    expected = DECLARED_PORT_RATE_GBPS.get(fabric_kind)
    if expected:
        warnings += [
            f"{p.ca} port {p.port} runs at {p.rate_gbps} Gb/s; the fabric is declared {fabric_label} "
            f"({expected} Gb/s per port)"
            for p in mine
            if p.is_up and p.rate_gbps < expected
        ]
    return warnings


def _ethernet_warnings(fabric_kind: str, fabric_label: str, ports: tuple[IbPort, ...]) -> list[str]:
    """An Ethernet fabric: say when no Ethernet port is up, so its declared figure goes unconfirmed."""
    wanted = FABRIC_PORT_TRANSPORTS.get(fabric_kind, ())
    if not wanted or any(p.is_up and p.transport in wanted for p in ports):
        return []
    return [
        f"no Ethernet port is up for the fabric {fabric_label}: ibstat and /sys/class/infiniband list "
        "RDMA-capable NICs only, so its declared per-host bandwidth is not confirmed"
    ]
