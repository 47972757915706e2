"""A job on a local-host cluster, run as root, finds every door back into Volt shut (issue 21).

Jobs share Volt's machine and network namespace on `local` hosts. A hostile job tried: Volt's Redis (every
install's channels; a Celery message LPUSHed onto a queue is run by Volt's worker as root), its PostgreSQL
(trust auth on developers' machines, over TCP or its Unix socket), its web port, and Volt's files. Each
must be refused by the machine, not by Volt's good manners: an nftables rule per install refuses the
cluster's uid on Volt's service ports, the node's own mount namespace hides the services' socket folders,
and the files are closed by their modes.

Real Ray on 127.0.0.N, real provisioning (Celery tasks in-process at commit), the job submitted through
the cluster's own dashboard with its token, as the team would.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import textwrap
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from clusters import services, tenancy
from clusters.models import Cluster
from clusters.provisioning import node_firewall, ray_nodes
from inventory import local_runtime
from voltweb import datadir, namespace

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db,
    pytest.mark.skipif(
        os.geteuid() != 0, reason="a Unix user of the cluster's own needs root (CI runs as root)"
    ),
]

HOSTILE = textwrap.dedent("""
    import json, os, socket
    found = {{}}

    def tcp(name, host, port, send=b"PING\\r\\n"):
        s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        s.settimeout(3)
        try:
            s.connect((host, port))
        except OSError as exc:
            found[name] = "shut: " + type(exc).__name__
            s.close()
            return
        found[name] = "open"  # connected: whatever it answers, the door is open
        try:
            if send:
                s.sendall(send)
                found[name] = "open: " + repr(s.recv(64))
        except OSError:
            pass
        finally:
            s.close()

    def unix(name, path):
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(3)
        try:
            s.connect(path)
            found[name] = "open"
        except OSError as exc:
            found[name] = "shut: " + type(exc).__name__
        finally:
            s.close()

    def read(name, path):
        try:
            with open(path, "rb") as handle:
                found[name] = "open: " + repr(handle.read(32))
        except OSError as exc:
            found[name] = "shut: " + type(exc).__name__

    for name, (host, port) in {targets}.items():
        tcp(name, host, port)
    # The Celery queue itself: an LPUSH of a task message onto the provisioning queue, as the attack did.
    tcp("celery queue", {redis_host}, {redis_port}, b"*3\\r\\n$5\\r\\nLPUSH\\r\\n$12\\r\\nprovisioning\\r\\n$2\\r\\n{{}}\\r\\n")
    for name, path in {sockets}.items():
        unix(name, path)
    for name, path in {files}.items():
        read(name, path)
    # Control: traffic of the job itself on loopback passes (gloo listens on 127.0.0.1 too).
    own = socket.socket()
    own.bind(("127.0.0.1", 0))
    own.listen(1)
    tcp("own listener", "127.0.0.1", own.getsockname()[1], b"")
    print("VOLT_HOSTILE " + json.dumps({{"uid": os.getuid(), "found": found}}))
""")


@pytest.fixture(autouse=True)
def provisioning_settings(settings):
    settings.VOLT_AUTO_PROVISION = True
    settings.VOLT_PROBE_MAX_MB = 4
    settings.VOLT_PROBE_ITERS = 2
    settings.VOLT_NODE_JOIN_TIMEOUT_S = 120
    settings.VOLT_SLOW_HOST_REPLACEMENTS = 0


@pytest.fixture
def volt_web_port(settings):
    """A listening web port of Volt's, named in VOLT_SERVICE_PORTS as the demo names its own."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]
    settings.VOLT_SERVICE_PORTS = [*settings.VOLT_SERVICE_PORTS, port]
    yield port
    server.close()


@pytest.fixture
def volt_files(settings):
    """Volt's files as a demo has them: the SQLite database and the generated secrets, in its data dir."""
    data_dir = Path(settings.VOLT_DATA_DIR)
    database = data_dir / "volt.sqlite3"
    datadir.make_private(data_dir, database)
    database.write_bytes(b"SQLite format 3\x00 users' password hashes")
    secrets = data_dir / "demo-secrets.json"
    secrets.write_text('{"SECRET_KEY": "x"}')
    secrets.chmod(0o600)
    return {"sqlite database": str(database), "secrets": str(secrets)}


def test_a_hostile_job_finds_every_door_into_volt_shut(
    alice, northwind, northwind_ib, add_local_host, client_for, committed, volt_web_port, volt_files
):
    if os.environ.get("CI"):
        assert local_runtime.uses_runtime(), local_runtime.check()
    add_local_host(northwind, northwind_ib, "hostile", gpus=2)
    with committed():
        created = client_for(alice).post(
            "/api/v1/clusters/", {"name": "hostile", "nodes": 1, "gpus_per_node": 1, "gpu_models": ["H100"]},
            format="json",
        ).json()  # fmt: skip
    cluster = client_for(alice).get(f"/api/v1/clusters/{created['id']}/").json()
    assert cluster["status"] == "ready", cluster["failure_message"]
    row = Cluster.objects.get(pk=cluster["id"])
    table = node_firewall.table_name(namespace.current_id())
    try:
        assert row.node_user, "as root with the local runtime, the cluster runs as a user of its own"
        assert not row.events.filter(message=tenancy.NOT_FIREWALLED).exists()
        redis = django_settings.REDIS_URL
        redis_host, redis_port = _host_port(redis, 6379)
        targets = {"redis": (redis_host, redis_port), "redis via ::1": ("::1", redis_port),
                   "web": ("127.0.0.1", volt_web_port)}  # fmt: skip
        # The checkpoint store's keyless ports (an embedded SeaweedFS's filer, master, volume server): its
        # S3 API is the jobs' to use, with their cluster's key; these would let a job past every key.
        for port in django_settings.VOLT_STORE_PRIVATE_PORTS:
            targets[f"store port {port}"] = ("127.0.0.1", int(port))
        if os.environ.get("CI"):
            assert django_settings.VOLT_STORE_PRIVATE_PORTS, "scripts/test starts a store and names its ports"
        sockets = {}
        database = django_settings.DATABASES["default"]
        if "postgresql" in database["ENGINE"]:
            port = int(database.get("PORT") or 5432)
            targets["postgresql"] = (database.get("HOST") or "127.0.0.1", port)
            sockets["postgresql socket"] = f"/run/postgresql/.s.PGSQL.{port}"
            assert Path(sockets["postgresql socket"]).exists()  # it is there for Volt, not for the job
        script = HOSTILE.format(
            targets=json.dumps(targets), redis_host=json.dumps(redis_host), redis_port=redis_port,
            sockets=json.dumps(sockets), files=json.dumps(volt_files),
        )  # fmt: skip
        assert "'" not in script  # it goes to the shell inside single quotes
        connection = cluster["connection"]
        status, logs = ray_nodes.submit_job(
            connection["dashboard_url"], f"python -c '{script}'", timeout_s=120,
            auth_token=connection["ray_auth_token"],
        )  # fmt: skip
        assert status == "SUCCEEDED", logs
        line = next(line for line in logs.splitlines() if line.startswith("VOLT_HOSTILE "))
        seen = json.loads(line.removeprefix("VOLT_HOSTILE "))
        found = seen["found"]
        assert seen["uid"] != 0
        assert found.pop("own listener").startswith("open"), "the job's own loopback traffic must pass"
        assert {name: result for name, result in found.items() if not result.startswith("shut")} == {}, found
        # Refused by the rule at once, not left to time out.
        assert {found["redis"], found["web"], found["celery queue"]} == {"shut: ConnectionRefusedError"}
    finally:
        services.terminate_cluster(Cluster.objects.get(pk=row.pk), wait=True)
    # The cluster's user and its rule went together; the install's table with its last cluster.
    listed = subprocess.run(["nft", "list", "table", "inet", table], capture_output=True, text=True)
    assert listed.returncode != 0, listed.stdout


def _host_port(url: str, default: int) -> tuple[str, int]:
    from urllib.parse import urlparse

    parsed = urlparse(url)
    return parsed.hostname or "127.0.0.1", parsed.port or default
