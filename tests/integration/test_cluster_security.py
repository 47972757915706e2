"""A READY cluster on `local` hosts is its team's alone: Ray's token authentication, a clean environment
and (as root) a Unix user of the cluster's own. One 2-node cluster serves every assertion.

Real Ray on 127.0.0.N; placement and provisioning run as Celery tasks in-process at commit. A stand-in
for a Volt worker process (holding real settings in its environment) runs beside the cluster, as a
Celery worker on the same machine would: the job must not reach it.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import urllib.error
import urllib.request

import pytest
from django.conf import settings as django_settings
from django.test import Client
from ray.job_submission import JobSubmissionClient

from clusters import services, tenancy
from clusters.models import Cluster
from clusters.provisioning import ray_nodes
from clusters.tenancy import ray_cluster_id
from inventory import local_runtime
from inventory import services as inventory

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

SECRET_NAMES = ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "VOLT_ENCRYPTION_KEY", "DJANGO_SETTINGS_MODULE")


@pytest.fixture(autouse=True)
def provisioning_settings(settings):
    settings.VOLT_AUTO_PROVISION = True
    settings.VOLT_PROBE_MAX_MB = 4
    settings.VOLT_PROBE_ITERS = 2
    settings.VOLT_NODE_JOIN_TIMEOUT_S = 120  # two cores shared by several Ray clusters
    settings.VOLT_SLOW_HOST_REPLACEMENTS = 0


@pytest.fixture
def volt_worker_stand_in(settings):
    """A process of Volt's user whose environment holds Volt's real settings, as a Celery worker's does."""
    secrets = {
        "DATABASE_URL": "postgres://volt:db-password-h9ray@127.0.0.1:5432/volt",
        "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/2"),
        "SECRET_KEY": django_settings.SECRET_KEY,
        "VOLT_ENCRYPTION_KEY": django_settings.VOLT_ENCRYPTION_KEY,
        "DJANGO_SETTINGS_MODULE": "voltweb.settings",
    }
    process = subprocess.Popen(["sleep", "600"], env={"PATH": "/usr/bin:/bin", **secrets})
    yield process.pid, secrets
    process.kill()
    process.wait()


@pytest.fixture
def local_hosts(northwind, northwind_ib, add_local_host):
    return [add_local_host(northwind, northwind_ib, f"s{i}", gpus=2, price=f"2.{i}0") for i in range(2)]


def http(url: str, method: str = "GET", token: str | None = None, body: dict | None = None) -> int:
    """The HTTP status the dashboard answers."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json", **ray_nodes.auth_headers(token)}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, data, headers, method=method), timeout=30
        ) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def console_page(user, cluster_id: int) -> str:
    browser = Client()
    browser.force_login(user)
    response = browser.get(f"/clusters/{cluster_id}/")
    assert response.status_code == 200
    return response.content.decode()


PROBE_ENVIRONMENT = textwrap.dedent("""
    import glob, importlib.util, json, os, sys
    stand_in = {pid}
    readable = {{}}
    for path in glob.glob("/proc/[0-9]*/environ"):
        try:
            readable[path] = open(path, "rb").read().decode(errors="replace")
        except OSError:
            pass
    try:
        open(f"/proc/{{stand_in}}/environ", "rb").read()
        stand_in_readable = True
    except OSError:
        stand_in_readable = False
    print("VOLT_PROBE " + json.dumps({{
        "uid": os.getuid(), "environ": dict(os.environ), "own": open("/proc/self/environ").read(),
        "readable": readable, "stand_in_readable": stand_in_readable, "executable": sys.executable,
        "importable": [n for n in ("django", "voltweb", "clusters") if importlib.util.find_spec(n)],
    }}))
""")


def test_ready_cluster_refuses_strangers_and_its_jobs_cannot_reach_volts_secrets(
    alice, bob, root, local_hosts, client_for, committed, volt_worker_stand_in
):
    stand_in_pid, secrets = volt_worker_stand_in
    body = {"name": "private", "nodes": 2, "gpus_per_node": 2, "gpu_models": ["H100"]}
    with committed():
        created = client_for(alice).post("/api/v1/clusters/", body, format="json").json()
    cluster = client_for(alice).get(f"/api/v1/clusters/{created['id']}/").json()
    assert cluster["status"] == "ready", cluster["failure_message"]
    row = Cluster.objects.get(pk=cluster["id"])
    try:
        connection = cluster["connection"]
        token, dashboard = connection["ray_auth_token"], connection["dashboard_url"]

        # The hand-off: the token is the team's, encrypted at rest, never in lists, never to others.
        assert len(token) == 64 and token not in row.ray_auth_token_encrypted
        assert token in connection["snippet"]
        listed = client_for(alice).get("/api/v1/clusters/").json()["results"][0]
        assert listed["connection"]["ray_auth_token"] is None and token not in json.dumps(listed)
        assert client_for(bob).get(f"/api/v1/clusters/{row.pk}/").status_code == 404
        as_admin = client_for(root).get(f"/api/v1/clusters/{row.pk}/").json()
        assert as_admin["connection"]["ray_auth_token"] is None and token not in json.dumps(as_admin)
        assert token in console_page(alice, row.pk) and token not in console_page(root, row.pk)

        # Without the token the dashboard answers nothing: job submission, the state API.
        job = {"entrypoint": "id"}
        assert http(f"{dashboard}/api/jobs/", "POST", body=job) == 401
        assert http(f"{dashboard}/api/jobs/", "POST", token="0" * 64, body=job) == 403
        assert http(f"{dashboard}/api/v0/nodes") == 401
        assert http(f"{dashboard}/api/v0/nodes", token=token) == 200
        with pytest.raises(Exception, match="Authentication required"):
            JobSubmissionClient(dashboard).submit_job(entrypoint="id")

        # With it (as the snippet says), a job runs: it finds no Volt secret anywhere it can read.
        script = PROBE_ENVIRONMENT.format(pid=stand_in_pid)
        status, logs = ray_nodes.submit_job(
            dashboard, f"python -c '{script}'", timeout_s=120, auth_token=token
        )
        assert status == "SUCCEEDED", logs
        line = next(line for line in logs.splitlines() if line.startswith("VOLT_PROBE "))
        seen = json.loads(line.removeprefix("VOLT_PROBE "))
        everything = json.dumps(seen)
        # As root, a user of the cluster's own, running Ray from the local runtime (a venv every user
        # can run: `manage.py local_runtime`, built by scripts/test as root). CI must have it: without
        # it the job would run as Volt and could read Volt's processes (the timeline would say so).
        if os.environ.get("CI") and os.geteuid() == 0:
            assert local_runtime.uses_runtime(), local_runtime.check()
        isolated = os.geteuid() == 0 and local_runtime.uses_runtime()
        if local_runtime.uses_runtime():  # the job's driver runs the runtime's python, no Volt code
            assert seen["executable"] == str(local_runtime.check().python), seen["executable"]
            assert seen["importable"] == [], seen["importable"]
        own_environment = json.dumps([seen["environ"], seen["own"]])
        for name, value in secrets.items():
            assert value not in own_environment and f"{name}=" not in own_environment, name
        # The node marker and the fabric shim's own address are Volt's only variables a job may see.
        allowed = {"VOLT_RAY_NODE", "VOLT_HOST_ADDRESS"}
        assert not [k for k in seen["environ"] if k.startswith(("VOLT_", "DJANGO_")) and k not in allowed]
        assert "PYTHONPATH" not in seen["own"]  # Volt's source is not put on the job's path
        if isolated:
            assert seen["stand_in_readable"] is False
            for name, value in secrets.items():
                assert value not in everything and f"{name}=" not in everything, name
            assert seen["uid"] != 0 and row.node_user
            assert not row.events.filter(message=tenancy.NOT_ISOLATED).exists()
            assert subprocess.run(
                ["id", "-u", row.node_user], capture_output=True, text=True
            ).stdout.strip() == (str(seen["uid"]))
        else:
            assert row.events.filter(message=tenancy.NOT_ISOLATED).exists()
    finally:
        services.terminate_cluster(Cluster.objects.get(pk=row.pk), wait=True)

    # Terminated: nothing of the cluster runs, and its Unix user is gone with whatever ran as it.
    for host in local_hosts:
        with inventory.driver_for(host) as driver:
            assert ray_nodes.node_processes(driver, ray_cluster_id(row)) == []
    if os.geteuid() == 0 and row.node_user:
        assert subprocess.run(["id", row.node_user], capture_output=True).returncode != 0
