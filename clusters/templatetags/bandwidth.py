"""`{{ value|gbps }}` / `{{ value|gbps:2 }}`: a bandwidth in GB/s that never rounds to 0.0.

Emulated local links run at the declared rate x VOLT_LOCAL_FABRIC_SCALE (0.00025): a site backbone is
0.003 GB/s, a WAN link 0.0003 GB/s, which `floatformat:1` showed as "0.0 GB/s". From 0.1 up the fixed
places stay as they were; below, two significant digits."""

from __future__ import annotations

from django import template

register = template.Library()


@register.filter
def gbps(value, places: int = 1) -> str:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return ""
    if number == 0 or abs(number) >= 0.1:
        return f"{number:.{int(places)}f}"
    return f"{number:.2g}"
