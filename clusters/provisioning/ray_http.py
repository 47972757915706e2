"""A Volt cluster's head over HTTP: the state API's node list and the job submission API.

Django and Celery processes talk to a cluster only this way (DESIGN.md "Processes"): never
`ray.init()`. Every call takes the cluster's Ray token (`auth_token`), sent as `Authorization: Bearer`
on each request, so nothing process-wide (RAY_AUTH_MODE, ~/.ray/auth_token) is involved and one
worker can drive many clusters at once. Pure Python.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Collection, Mapping, Sequence
from typing import Any


class NodesNotReady(Exception):
    """The head did not report the expected nodes ALIVE in time; `alive` / `missing` list node IPs."""

    code = "nodes_not_ready"

    def __init__(self, message: str, alive: Sequence[str] = (), missing: Sequence[str] = ()):
        super().__init__(message)
        self.alive = list(alive)
        self.missing = list(missing)


class JobTimedOut(Exception):
    """A submitted job did not reach a terminal status in time (it was asked to stop)."""

    code = "job_timeout"

    def __init__(self, message: str, submission_id: str, status: str, logs: str):
        super().__init__(message)
        self.submission_id = submission_id
        self.status = status
        self.logs = logs


def wait_for_nodes(
    dashboard_url: str,
    expected: int,
    timeout_s: float,
    *,
    expected_ips: Collection[str] | None = None,
    poll_s: float = 1.0,
    auth_token: str | None = None,
) -> list[dict[str, Any]]:
    """Poll the head's state API until `expected` nodes (and every one of `expected_ips`) are ALIVE.

    Returns the ALIVE nodes (state API records: node_id, node_ip, is_head_node, state, resources_total,
    ...). `auth_token`: the cluster's Ray token (sent as `Authorization: Bearer`). Raises NodesNotReady after `timeout_s`, naming the IPs that joined and those that did not.
    """
    deadline = time.monotonic() + timeout_s
    wanted = set(expected_ips or ())
    alive: list[dict[str, Any]] = []
    error = "no answer yet"
    while True:
        try:
            alive = [
                node
                for node in list_nodes(dashboard_url, timeout_s=5.0, auth_token=auth_token)
                if node.get("state") == "ALIVE"
            ]
            error = ""
        except HeadUnreachable as exc:  # refused, timeouts, a half-started dashboard
            error = f"{type(exc).__name__}: {exc}"
        ips = {node.get("node_ip") for node in alive}
        if not error and len(alive) >= expected and wanted <= ips:
            return alive
        if time.monotonic() + poll_s > deadline:
            break
        time.sleep(poll_s)
    joined = sorted(ip for ip in ips if ip)
    missing = sorted(wanted - ips)
    detail = f"the dashboard did not answer ({error})" if error and not alive else (
        f"{len(alive)} of {expected} nodes ALIVE; joined: {', '.join(joined) or 'none'}; "
        f"not joined: {', '.join(missing) if missing else ('unknown' if not wanted else 'none')}"
    )  # fmt: skip
    raise NodesNotReady(
        f"Ray cluster at {dashboard_url} not ready after {timeout_s:g} s: {detail}.", joined, missing
    )


def auth_headers(auth_token: str | None) -> dict[str, str]:
    """The HTTP header a token-authenticated Ray dashboard expects (none without a token)."""
    return {"Authorization": f"Bearer {auth_token}"} if auth_token else {}


class HeadUnreachable(Exception):
    """The head's dashboard did not answer, or answered with an error."""


def head_request(dashboard_url: str, path: str, timeout_s: float, token: str | None = "") -> Any:
    """GET `path` on the head's dashboard with the cluster's token and return its JSON; HeadUnreachable on
    any failure (refused, timeout, 401/403 without the right token, not JSON). Every HTTP GET Volt sends a
    Ray head goes through here (job submission goes through Ray's own client, with auth_headers)."""
    if not dashboard_url:
        raise HeadUnreachable("the cluster has no Ray dashboard address")
    request = urllib.request.Request(f"{dashboard_url.rstrip('/')}{path}", headers=auth_headers(token))
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.load(response)
    except (OSError, ValueError) as exc:  # URLError, HTTPError, refused, timeout, bad JSON
        raise HeadUnreachable(
            f"Ray head at {dashboard_url} did not answer: {type(exc).__name__}: {exc}"
        ) from exc


def list_nodes(dashboard_url: str, timeout_s: float, auth_token: str | None = None) -> list[dict[str, Any]]:
    """Every node the head's state API knows (node_ip, state ALIVE/DEAD, is_head_node, ...)."""
    path = f"/api/v0/nodes?limit=10000&timeout={max(1, int(timeout_s))}"
    body = head_request(dashboard_url, path, timeout_s, auth_token)
    if not isinstance(body, dict) or not body.get("result", False):
        raise HeadUnreachable(f"Ray head state API error: {str(body)[:200]}")
    return body["data"]["result"]["result"]


def submit_job(
    dashboard_url: str,
    entrypoint: str,
    runtime_env: Mapping[str, Any] | None = None,
    timeout_s: float = 300.0,
    *,
    submission_id: str | None = None,
    poll_s: float = 0.5,
    auth_token: str | None = None,
) -> tuple[str, str]:
    """Submit a Ray job over HTTP, wait for a terminal status; return (status, logs).

    Status is a `ray.job_submission.JobStatus` value ("SUCCEEDED", "FAILED", "STOPPED"). Past
    `timeout_s` the job is asked to stop and JobTimedOut is raised with its logs so far. `auth_token`:
    the cluster's Ray token (an explicit header, so no process-wide Ray setting is involved).
    """
    from ray.job_submission import JobStatus, JobSubmissionClient  # heavy import: only when used

    client = JobSubmissionClient(dashboard_url, headers=auth_headers(auth_token))
    job_id = client.submit_job(
        entrypoint=entrypoint, runtime_env=dict(runtime_env or {}), submission_id=submission_id
    )
    deadline = time.monotonic() + timeout_s
    status = client.get_job_status(job_id)
    while not status.is_terminal():
        if time.monotonic() > deadline:
            try:
                client.stop_job(job_id)
            finally:
                logs = _logs_or_empty(client, job_id)
            raise JobTimedOut(
                f"job {job_id} on {dashboard_url} still {status.value} after {timeout_s:g} s; asked it to stop.",
                job_id, status.value, logs,
            )  # fmt: skip
        time.sleep(poll_s)
        status = client.get_job_status(job_id)
    return JobStatus(status).value, _logs_or_empty(client, job_id)


def _logs_or_empty(client: Any, job_id: str) -> str:
    try:
        return client.get_job_logs(job_id)
    except Exception:  # noqa: BLE001 - logs are best effort next to a status
        return ""
