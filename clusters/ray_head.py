"""Every HTTP call Volt's telemetry makes to a cluster's Ray head goes through `head_request`.

Every call sends the cluster's Ray token (`token_for`): a head answers 401 without it.
Pure of Django models: it takes the head's dashboard URL and the cluster's token (empty: none).
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any


def token_for(cluster) -> str:
    """The token Volt sends to `cluster`'s head: its per-cluster Ray token (every head runs Ray's token
    auth, clusters/tenancy.py), "" before provisioning made one.

    The one place telemetry looks the token up; every caller passes its result to head_request.
    """
    from clusters import tenancy

    return tenancy.ray_auth_token(cluster)


class HeadUnreachable(Exception):
    """The head's dashboard did not answer, or answered with an error."""


def head_request(dashboard_url: str, path: str, timeout_s: float, token: str = "") -> Any:
    """GET `path` on the head's dashboard and return its JSON; raise HeadUnreachable on any failure."""
    if not dashboard_url:
        raise HeadUnreachable("the cluster has no Ray dashboard address")
    request = urllib.request.Request(f"{dashboard_url.rstrip('/')}{path}")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.load(response)
    except (OSError, ValueError) as exc:  # URLError, refused, timeout, bad JSON
        raise HeadUnreachable(
            f"Ray head at {dashboard_url} did not answer: {type(exc).__name__}: {exc}"
        ) from exc


def head_nodes(dashboard_url: str, timeout_s: float, token: str = "") -> list[dict[str, Any]]:
    """The head's node list (state API records: node_ip, state ALIVE/DEAD, is_head_node, ...)."""
    timeout_arg = max(1, int(timeout_s))
    body = head_request(dashboard_url, f"/api/v0/nodes?limit=10000&timeout={timeout_arg}", timeout_s, token)
    if not isinstance(body, dict) or not body.get("result", False):
        raise HeadUnreachable(f"Ray head state API error: {str(body)[:200]}")
    return body["data"]["result"]["result"]
