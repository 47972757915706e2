"""Telemetry's side of a cluster's Ray head: the token Volt sends it (`token_for`) and the node list.

The HTTP client itself is one module, clusters/provisioning/ray_http.py (`head_request`, `list_nodes`):
provisioning, the watch, recovery and the idle-probe check all call the head through it.
"""

from __future__ import annotations

from typing import Any

from clusters import tenancy
from clusters.provisioning.ray_http import HeadUnreachable, head_request, list_nodes

__all__ = ["HeadUnreachable", "head_nodes", "head_request", "token_for"]


def token_for(cluster) -> str:
    """The token Volt sends to `cluster`'s head: its per-cluster Ray token (every head runs Ray's token
    auth, clusters/tenancy.py), "" before provisioning made one.

    The one place telemetry looks the token up; every caller passes its result to head_request.
    """
    return tenancy.ray_auth_token(cluster)


def head_nodes(dashboard_url: str, timeout_s: float, token: str = "") -> list[dict[str, Any]]:
    """The head's node list (state API records: node_ip, state ALIVE/DEAD, is_head_node, ...)."""
    return list_nodes(dashboard_url, timeout_s, token)
