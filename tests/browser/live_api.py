"""The demo-style stack's API and database as the browser tests drive them (helpers shared by test files)."""

from __future__ import annotations

import json
import random
import threading
import urllib.request


def alice_token() -> str:
    from django.contrib.auth import get_user_model

    from tests.clusters.live_helpers import start_cluster_ids_at
    from voltweb import services as accounts

    start_cluster_ids_at(random.randrange(100_000, 900_000))
    return accounts.create_api_token(get_user_model().objects.get(username="alice"), "browser").secret


def request_cluster(stack, token: str, name: str = "live-browser") -> int:
    """Through the stack's API, so placement and provisioning go to the stack's worker."""
    body = json.dumps({"name": name, "nodes": 2, "gpus_per_node": 1, "gpu_models": ["H100"],
                       "team": "demo-lab"}).encode()  # fmt: skip
    request = urllib.request.Request(
        f"{stack.url}/api/v1/clusters/", body, method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)["id"]


def cluster_status(cluster_id: int) -> tuple[str, str]:
    from clusters.models import Cluster

    cluster = Cluster.objects.get(pk=cluster_id)
    return cluster.status, cluster.failure_message


def admin_token() -> str:
    from django.contrib.auth import get_user_model

    from voltweb import services as accounts

    return accounts.create_api_token(get_user_model().objects.get(username="admin"), "browser-admin").secret


def faults(stack, token: str, host_id: int, method: str, body: dict | None = None) -> dict:
    """The stack's faults API for a host: GET lists, POST injects, DELETE clears."""
    request = urllib.request.Request(
        f"{stack.url}/api/v1/hosts/{host_id}/faults/", json.dumps(body).encode() if body else None,
        method=method, headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


def worker_host_id(cluster_id: int) -> int:
    from clusters.models import ClusterNode

    node = ClusterNode.objects.get(cluster_id=cluster_id, is_head=False, released_at__isnull=True)
    return node.host_id


def worker_node_sandbox(cluster_id: int):
    from clusters.models import ClusterNode
    from inventory import services as inventory

    node = ClusterNode.objects.select_related("host__provider").get(
        cluster_id=cluster_id, is_head=False, released_at__isnull=True
    )
    return inventory.sandbox_path(node.host).name, node.host.name  # the folder name; the stack's data dir


def terminate(cluster_id: int) -> None:
    from clusters import services
    from clusters.models import Cluster

    cluster = Cluster.objects.get(pk=cluster_id)
    if cluster.status in services.LIVE:
        services.terminate_cluster(cluster, wait=True)
    elif cluster.status == "terminating":
        services.finish_termination(cluster)


def sweep(stack, cluster_id: int) -> None:
    from celery import Celery

    app = Celery("volt-browser-beat", broker=stack.redis_url)
    try:
        app.send_task("clusters.tasks.sweep_cluster_task", args=[cluster_id], queue="monitoring")
    finally:
        app.close()


class JobPoller:
    """Sends jobs.tasks.poll_jobs_task to the stack's worker every second (the stack has no beat)."""

    def __init__(self, stack):
        from celery import Celery

        self.app = Celery("volt-browser-jobs-beat", broker=stack.redis_url)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        for _ in range(900):  # bounded: 15 minutes at most
            if self.stop.wait(1.0):
                return
            self.app.send_task("jobs.tasks.poll_jobs_task", queue="jobs", expires=2)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(5)
        self.app.close()
