"""Parse plain `ibstat`: one block per channel adapter (CA), one sub-block per port.

Pure Python (no Django import). Real output::

    CA 'mlx5_0'
            CA type: MT4129
            Number of ports: 1
            ...
            Port 1:
                    State: Active
                    Physical state: LinkUp
                    Rate: 400
                    ...
                    Link layer: InfiniBand

RoCE ports say `Link layer: Ethernet`. Indentation is not relied on.
"""

from __future__ import annotations

import re

from inventory.discovery.types import IbPort, ParseError

_CA = re.compile(r"^CA '([^']+)'$")
_PORT = re.compile(r"^Port (\d+):$")
_KEY_VALUE = re.compile(r"^([A-Za-z][A-Za-z ]*):\s*(.*)$")
_RATE = re.compile(r"^(\d+(?:\.\d+)?)")
_PORT_KEYS = ("State", "Physical state", "Rate")


def _line_ref(number: int, line: str) -> str:
    shown = line if len(line) <= 160 else line[:157] + "..."
    return f"line {number}: {shown!r}"


def _port(ca: str, port: int, values: dict[str, str], number: int) -> IbPort:
    """Build one IbPort from the `key: value` lines of its block (which began at line `number`)."""
    absent = [key for key in _PORT_KEYS if key not in values]
    rate = _RATE.match(values.get("Rate", ""))
    if absent or not rate:
        what = f"{', '.join(absent)} missing" if absent else f"Rate {values['Rate']!r} is not a number"
        raise ParseError(
            f"ibstat: expected State, Physical state and a numeric Rate for {ca} port {port} "
            f"(block at line {number}): {what}"
        )
    return IbPort(
        ca=ca,
        port=port,
        state=values["State"],
        physical_state=values["Physical state"],
        rate_gbps=round(float(rate.group(1))),
        link_layer=values.get("Link layer", "InfiniBand"),  # ibstat before link layers existed: IB only
    )


def _blocks(text: str) -> list[tuple[str, int, int, dict[str, str]]]:
    """(CA, port, line number, its `key: value` pairs) for each `Port <n>:` block."""
    blocks: list[tuple[str, int, int, dict[str, str]]] = []
    ca: str | None = None
    port_values: dict[str, str] | None = None  # None between a CA line and its first port
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if match := _CA.match(line):
            ca, port_values = match.group(1), None
        elif ca and (match := _PORT.match(line)):
            port_values = {}
            blocks.append((ca, int(match.group(1)), number, port_values))
        elif ca and (match := _KEY_VALUE.match(line)):
            if port_values is not None:  # CA-level keys (CA type, firmware...) are not needed
                port_values[match.group(1)] = match.group(2).strip()
        else:
            expected = '"CA \'<name>\'", "Port <n>:" or "key: value"'
            raise ParseError(f"ibstat: expected {expected}, saw {_line_ref(number, line)}")
    return blocks


def parse_ibstat(text: str) -> tuple[IbPort, ...]:
    """Parse `ibstat` output into its ports, in printed order. Empty output: no ports (no HCA)."""
    return tuple(_port(ca, port, values, number) for ca, port, number, values in _blocks(text))
