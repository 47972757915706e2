"""Telemetry's side of a cluster's Ray head: the token Volt sends it (`token_for`) and the node list.

The HTTP client itself is one module, clusters/provisioning/ray_http.py (`head_request`, `list_nodes`):
provisioning, the watch, recovery and the idle-probe check all call the head through it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from clusters import tenancy
from clusters.provisioning.ray_http import HeadUnreachable, head_request, list_nodes
from inventory import tunnels
from inventory.drivers.base import DriverError

__all__ = ["HeadUnreachable", "dashboard_for", "head_nodes", "head_request", "token_for"]


def dashboard_for(cluster) -> str:
    """The URL this process reaches `cluster`'s head dashboard at: its recorded `dashboard_url` on local
    hosts, a local SSH forward to it on SSH hosts (inventory/tunnels.py; providers open SSH alone).
    "" before the cluster has a head. HeadUnreachable when the head's host cannot be reached over SSH.

    Every call Volt makes to a head (state API, job submission, logs) starts here."""
    url = cluster.dashboard_url
    if not url:
        return ""
    address = urlsplit(url).hostname
    nodes = sorted(
        cluster.nodes.select_related("host"), key=lambda n: (n.released_at is not None, not n.is_head)
    )
    host = next((n.host for n in nodes if n.node_ip == address), None)
    if host is None:
        return url  # the head's node record is gone: try the recorded address (it fails as unreachable)
    try:
        return tunnels.http_url(host, url)
    except (DriverError, ValueError) as exc:
        raise HeadUnreachable(f"Volt could not reach {host.name}'s Ray dashboard over SSH: {exc}") from exc


def token_for(cluster) -> str:
    """The token Volt sends to `cluster`'s head: its per-cluster Ray token (every head runs Ray's token
    auth, clusters/tenancy.py), "" before provisioning made one.

    The one place telemetry looks the token up; every caller passes its result to head_request.
    """
    return tenancy.ray_auth_token(cluster)


def head_nodes(dashboard_url: str, timeout_s: float, token: str = "") -> list[dict[str, Any]]:
    """The head's node list (state API records: node_ip, state ALIVE/DEAD, is_head_node, ...)."""
    return list_nodes(dashboard_url, timeout_s, token)
