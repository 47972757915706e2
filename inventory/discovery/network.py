"""NIC ports: read from /sys/class/infiniband where ibstat is absent, counted by transport, and checked
against the fabric the provider declared. Pure Python (no Django import).

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
from dataclasses import replace

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


def fabric_warnings(fabric_kind: str, fabric_label: str, ports: tuple[IbPort, ...]) -> list[str]:
    """Where the discovered ports contradict the declared fabric (empty when they agree).

    An InfiniBand fabric needs InfiniBand ports, up, at its rate (NDR 400, HDR 200 Gb/s); a RoCE
    fabric needs RoCE ports, up. Plain Ethernet ports (management) are never held against a fabric.
    """
    transport = _FABRIC_TRANSPORT.get(fabric_kind)
    if transport is None:
        return []
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
