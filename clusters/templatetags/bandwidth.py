"""`{{ value|gbps }}` / `{{ value|gbps:2 }}`: a bandwidth in GB/s that never rounds to 0.0, by the same
rule as the timeline's and the API's messages (placement.bandwidth.format_gbps): fixed places from
0.1 GB/s up, two significant digits below (emulated links: a site backbone is 0.003 GB/s)."""

from __future__ import annotations

from django import template

from clusters.placement.bandwidth import format_gbps

register = template.Library()


@register.filter
def gbps(value, places: int = 1) -> str:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return ""
    return format_gbps(number, places)
