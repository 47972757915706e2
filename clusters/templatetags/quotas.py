"""`{% team_quotas teams as rows %}`: each team's quota beside its use (GPUs in use, per model, GPU-hours this
month), for the teams page (a voltweb template). Use is read from the clusters' allocations, so the
accounts app imports nothing of the clusters app: its template loads this tag. A fixed number of queries
for any number of teams (the page's query count is pinned)."""

from __future__ import annotations

from django import template

from clusters import quotas

register = template.Library()


@register.simple_tag
def team_quotas(teams) -> list[quotas.TeamQuotaView]:
    return quotas.quota_views(teams)


@register.filter
def share_pct(used, cap) -> int:
    """How much of `cap` `used` is, in percent, for a bar (capped at 100; 0 without a cap)."""
    if not cap:
        return 100 if cap == 0 and used else 0
    return min(100, round(100 * float(used) / float(cap)))
