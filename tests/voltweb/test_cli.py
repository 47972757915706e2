"""The `volt` command-line client against a real server (live_server) and, for --wait, a real Celery worker.

What a CI pipeline sees: the JSON on stdout, the messages on stderr and the exit code.
"""

from __future__ import annotations

import http.server
import json
import queue
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from celery.contrib.testing.worker import start_worker
from celery.signals import task_postrun
from django.conf import settings
from django.db import OperationalError, connection

from clusters import services as clusters
from clusters.choices import ClusterStatus
from clusters.models import Cluster
from clusters.tasks import place_cluster_task
from inventory import services as inventory
from inventory.choices import HostState
from voltweb import cli
from voltweb import services as accounts
from voltweb.celery import app as celery_app

pytestmark = pytest.mark.django_db(transaction=True)

CREATE = ["clusters", "create", "--name", "ci-run", "--gpu", "H100:8"]


@dataclass
class Run:
    code: int
    out: str
    err: str

    @property
    def json(self):
        return json.loads(self.out)


@pytest.fixture(autouse=True)
def empty_queues():
    """No task of an earlier test reaches this one's worker (scripts/test gives each run its own Redis DB)."""
    purge_queues()
    yield
    purge_queues()


def purge_queues() -> None:
    with celery_app.connection_for_write() as conn:
        for name in settings.VOLT_QUEUES:
            conn.default_channel.queue_purge(name)


@pytest.fixture
def worker(empty_queues):
    """A real worker thread consuming the placement and provisioning queues from Redis.

    Nothing is provisioned (VOLT_AUTO_PROVISION is off in tests; provisioning has its own tests in
    tests/integration/test_provisioning.py), so placed clusters stay `provisioning` here; the
    provisioning queue is consumed for the terminate task.
    """
    with start_worker(
        celery_app,
        pool="solo",
        perform_ping_check=False,
        queues=["placement", "provisioning"],
        shutdown_timeout=20,
    ):
        yield


@pytest.fixture
def hosts(northwind_ib, make_host):
    """Two free H100 x 8 hosts in one block, and a cordoned third: 3 nodes are possible, but not now."""
    r01 = northwind_ib.blocks.order_by("name").first()
    return [make_host(r01), make_host(r01), make_host(r01, state=HostState.CORDONED)]


@pytest.fixture
def token(alice):
    return accounts.create_api_token(alice, "ci").secret


@pytest.fixture
def volt(live_server, token, monkeypatch, capsys):
    """`volt(*argv)` runs the CLI in-process as alice's pipeline would, against the live server."""
    monkeypatch.setenv("VOLT_URL", live_server.url)
    monkeypatch.setenv("VOLT_TOKEN", token)
    monkeypatch.setenv("VOLT_POLL_INTERVAL", "0.2")

    def run(*argv: str) -> Run:
        capsys.readouterr()
        code = cli.main(list(argv))
        out, err = capsys.readouterr()
        return Run(code, out, err)

    return run


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_create_prints_the_requested_cluster(volt, hosts):
    run = volt(
        *CREATE, "--nodes", "2", "--interconnect", "infiniband", "--require-interconnect", "--priority", "5"
    )

    assert run.code == 0, run.err
    cluster = run.json
    assert cluster["status"] == "pending" and cluster["name"] == "ci-run" and cluster["team"] == "lab-a"
    stored = Cluster.objects.get(pk=cluster["id"]).spec
    assert stored["gpus_per_node"] == 8 and stored["gpu_models"] == ["H100"] and stored["priority"] == 5
    assert stored["interconnect"] == ["infiniband"] and stored["interconnect_mode"] == "required"


def test_impossible_spec_exits_1_with_the_apis_field_message(volt, hosts):
    run = volt("clusters", "create", "--nodes", "2", "--gpu", "H100:9")

    assert run.code == 1 and run.out == ""
    assert "400 invalid: gpus_per_node: 9 GPUs per node asked; the largest H100 host has 8" in run.err
    assert not Cluster.objects.exists()
    # docs/cli.md shows this error as the demo prints it (its H100 hosts are H100-SXM boards): word for word.
    documented = next(
        line
        for line in (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text().splitlines()
        if line.startswith("volt: 400 invalid: gpus_per_node")
    )
    assert documented.replace("H100-SXM", "H100") in run.err


def test_alternatives_must_ask_the_same_gpus_per_node(volt):
    run = volt("clusters", "create", "--nodes", "2", "--gpu", "H100:8", "--gpu", "A100:4")

    assert run.code == 1 and "same GPUs per node (H100:8, A100:4)" in run.err


def test_missing_token_exits_1_saying_where_to_get_one(volt, monkeypatch):
    monkeypatch.delenv("VOLT_TOKEN")

    run = volt("clusters", "list")

    assert run.code == 1 and "no API token: set VOLT_TOKEN" in run.err


def test_bad_token_exits_1_with_401(volt):
    run = volt("clusters", "list", "--token", "volt_not-a-real-token")

    assert run.code == 1 and "401" in run.err and "VOLT_TOKEN" in run.err


def test_get_list_events_and_terminate(volt, hosts, worker):
    cluster_id = volt(*CREATE, "--nodes", "2", "--wait-for", "provisioning").json["id"]

    got = volt("clusters", "get", str(cluster_id))
    assert got.code == 0 and got.json["status"] == "provisioning" and len(got.json["nodes"]) == 2
    assert [c["id"] for c in volt("clusters", "list", "--status", "provisioning").json] == [cluster_id]
    assert volt("clusters", "list", "--status", "queued", "--all-pages").json == []
    events = volt("clusters", "events", str(cluster_id)).json
    assert [e["to_status"] for e in events] == ["pending", "placing", "provisioning"]

    ended = volt("clusters", "terminate", str(cluster_id), "--wait")
    assert ended.code == 0 and ended.json["status"] == "terminated"
    again = volt("clusters", "terminate", str(cluster_id))
    assert again.code == 1 and "409 illegal_transition" in again.err
    assert volt("clusters", "terminate", str(cluster_id), "--ok-if-ended").code == 0


def test_another_teams_cluster_is_not_found(volt, hosts, bob):
    cluster_id = volt(*CREATE, "--nodes", "2").json["id"]

    bobs = accounts.create_api_token(bob, "ci").secret

    for command in ("get", "events", "terminate"):
        run = volt("clusters", command, str(cluster_id), "--token", bobs)
        assert run.code == 1 and f"cluster {cluster_id} not found" in run.err, command
    assert Cluster.objects.get(pk=cluster_id).status == ClusterStatus.PENDING


def test_failed_cluster_exits_2_with_its_failure_reason(volt, hosts):
    cluster_id = volt(*CREATE, "--nodes", "2").json["id"]
    for host in hosts:  # the provider retires every host before placement runs
        inventory.act_on_host(host, "retire")
    clusters.place_cluster(cluster_id)

    run = volt("clusters", "wait", str(cluster_id))

    assert run.code == 2
    assert run.json["status"] == "failed" and run.json["failure_reason"] == "config_invalid"
    assert "failed (config_invalid)" in run.err


def test_preview_shows_the_plan_without_allocating(volt, hosts):
    run = volt("clusters", "preview", "--nodes", "2", "--gpu", "H100:8", "--topology", "block")

    assert run.code == 0 and run.json["placed"] and run.json["spanned_level"] == "block"
    assert not Cluster.objects.exists()


@pytest.mark.integration
def test_create_waits_for_placement_through_the_worker(volt, hosts, worker):
    run = volt(*CREATE, "--nodes", "2", "--wait-for", "provisioning", "--timeout", "30")

    assert run.code == 0, run.err
    assert run.json["status"] == "provisioning" and len(run.json["nodes"]) == 2
    assert "pending" in run.err and "provisioning (2 x H100" in run.err


def patiently(action, timeout_s: float = 10):
    """Run a database action, again while the in-memory SQLite test database says `table is locked`.

    Its connections share one cache with table-level locks, so a second connection's write fails at once
    while the live server reads (PostgreSQL just waits). Safe to repeat: each try is one transaction.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return action()
        except OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.mark.integration
def test_wait_exits_3_when_the_queued_cluster_is_terminated_meanwhile(volt, hosts, worker, alice):
    queued_ids: queue.Queue[int] = queue.Queue()

    def note_queued(sender=None, args=(), retval=None, **_):
        if sender.name == place_cluster_task.name and retval == ClusterStatus.QUEUED:
            queued_ids.put(args[0])

    def cancel_it():  # another pipeline's cleanup step, through the service the API calls
        try:
            cluster_id = queued_ids.get(timeout=20)
            time.sleep(1)  # several polls: the waiting pipeline sees it queued first
            patiently(lambda: clusters.terminate_cluster(Cluster.objects.get(pk=cluster_id), alice))
        finally:
            connection.close()

    task_postrun.connect(note_queued, weak=False)
    operator = threading.Thread(target=cancel_it)
    operator.start()
    try:
        run = volt(*CREATE, "--nodes", "3", "--wait", "--timeout", "30")
    finally:
        operator.join()
        task_postrun.disconnect(note_queued)

    assert run.code == 3, run.err
    assert run.json["status"] == "terminated" and "queued (position 1" in run.err
    assert "was terminated before it became ready" in run.err


@pytest.mark.integration
def test_wait_times_out_with_exit_4_on_a_queued_cluster(volt, hosts, worker):
    started = time.monotonic()
    run = volt(*CREATE, "--nodes", "3", "--wait", "--timeout", "1")

    assert run.code == 4 and time.monotonic() - started < 10
    assert "timed out after 1 s waiting for ready" in run.err
    assert run.json["status"] in {"pending", "placing", "queued"}  # the id is there for the cleanup step


def test_unreachable_server_exits_1(volt):
    url = f"http://127.0.0.1:{closed_port()}"

    run = volt("clusters", "list", "--url", url)

    assert run.code == 1 and f"cannot reach Volt at {url}" in run.err


@pytest.fixture
def flaky_volt(monkeypatch):
    """A stand-in Volt on loopback answering GET /api/v1/clusters/5/ from a script: (status, body) each."""
    answers: list[tuple[int, dict]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            status, body = answers.pop(0) if len(answers) > 1 else answers[0]
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("VOLT_URL", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setenv("VOLT_TOKEN", "volt_test")
    monkeypatch.setenv("VOLT_POLL_INTERVAL", "0.1")
    yield answers
    server.shutdown()
    server.server_close()


def cluster_in(status: str) -> tuple[int, dict]:
    return 200, {"id": 5, "name": "ci-run", "status": status}


UNAVAILABLE = (503, {"error": {"code": "unavailable", "message": "Volt is restarting."}})


def test_wait_polls_through_a_server_restart(flaky_volt, capsys):
    flaky_volt.extend([cluster_in("queued"), UNAVAILABLE, UNAVAILABLE, cluster_in("ready")])

    code = cli.main(["clusters", "wait", "5"])

    out, err = capsys.readouterr()
    assert code == 0 and json.loads(out)["status"] == "ready"
    assert "503 unavailable: Volt is restarting.; retrying" in err


def test_wait_gives_up_with_exit_1_when_the_server_stays_broken(flaky_volt, capsys):
    flaky_volt.extend([cluster_in("queued"), (500, {"error": {"code": "error", "message": "boom"}})])

    code = cli.main(["clusters", "wait", "5", "--timeout", "0.5"])

    out, err = capsys.readouterr()
    assert code == 1 and out == "" and err.rstrip().endswith("500 error: boom")


def test_the_file_runs_on_a_bare_python_without_django():
    """-S -I: no site-packages, so any import beyond the standard library would fail."""
    url = f"http://127.0.0.1:{closed_port()}"
    command = [sys.executable, "-S", "-I", str(Path(cli.__file__)), "clusters", "get", "1", "--url", url]

    done = subprocess.run(command, env={"VOLT_TOKEN": "t"}, capture_output=True, text=True, timeout=30)

    assert done.returncode == 1 and "cannot reach Volt" in done.stderr


def test_statuses_are_the_apis():
    assert cli.STATUSES == tuple(ClusterStatus.values)


@pytest.mark.parametrize(
    ("status", "targets", "code"),
    [
        ("ready", ("ready",), 0),
        ("verifying", ("provisioning",), 0),  # the poll missed provisioning: placed all the same
        ("queued", ("ready",), None),
        ("degraded", ("ready",), None),
        ("failed", ("ready",), 2),
        ("terminating", ("ready",), 3),
        ("terminating", ("terminated",), None),
        ("terminated", ("terminated",), 0),
    ],
)
def test_how_a_wait_ends_at_each_status(status, targets, code):
    assert cli.outcome(status, targets) == code


def test_jobs_logs_tail_prints_the_last_lines_and_follows_from_there(volt, alice, team_a):
    """`volt jobs logs ID --tail N` reads the log backwards from its end only as far as N lines need (a
    pipeline wanting a failed job's last lines no longer downloads all 16 MB), then --follow goes on."""
    from jobs import services as jobs
    from jobs.models import Job

    cluster = Cluster.objects.create(team=team_a, created_by=alice, name="tail", status="terminated",
                                     spec={"nodes": 1, "gpus_per_node": 1, "gpu_models": ["H100"]})  # fmt: skip
    job = Job.objects.create(cluster=cluster, team=team_a, created_by=alice, entrypoint="python t.py",
                             status="failed")  # fmt: skip
    lines = [f"line {i:05d} données ✓ {'x' * 120}\n" for i in range(6000)]  # ~850 K characters: 4 pages
    for start in range(0, 6000, 1000):
        jobs.store_log(job, "".join(lines[start : start + 1000]).encode(), final=True)
    jobs.store_log(job, b"Traceback: the end, no newline", final=True)
    ending = "Traceback: the end, no newline"

    run = volt("jobs", "logs", str(job.pk), "--tail", "3")
    assert run.code == 0 and run.out == lines[-2] + lines[-1] + ending
    run = volt("jobs", "logs", str(job.pk), "--tail", "2500")  # across pages
    assert run.code == 0 and run.out == "".join(lines[-2499:]) + ending
    assert volt("jobs", "logs", str(job.pk), "--tail", "99999").out == "".join(lines) + ending
    assert volt("jobs", "logs", str(job.pk), "--tail", "0").out == ""
    run = volt("jobs", "logs", str(job.pk), "--tail", "1", "--follow")  # ended: exit by its status
    assert run.code == cli.EXIT_FAILED and run.out == ending
    run = volt("jobs", "logs", str(job.pk), "--tail", "lots")
    assert run.code == cli.EXIT_ERROR and "'lots' is not a number of lines" in run.err


def test_waiting_for_a_stop_reads_no_log_text(live_server, token, alice, team_a, monkeypatch):
    """`volt jobs stop --wait` only needs to know that the job ended and its log is all stored: it paged
    through the whole log (up to 16 MB) and threw the text away. Now it asks at the log's end."""
    from jobs import services as jobs
    from jobs.models import Job

    monkeypatch.setenv("VOLT_POLL_INTERVAL", "0.2")
    cluster = Cluster.objects.create(team=team_a, created_by=alice, name="stopped", status="terminated",
                                     spec={"nodes": 1, "gpus_per_node": 1, "gpu_models": ["H100"]})  # fmt: skip
    job = Job.objects.create(cluster=cluster, team=team_a, created_by=alice, entrypoint="python t.py",
                             status="stopped")  # fmt: skip
    for _ in range(4):
        jobs.store_log(job, ("y" * 199 + "\n").encode() * 1000, final=True)  # 800 K characters
    client = cli.Client(live_server.url, token)
    fetched = []
    real_get = client.get

    def get(path, params=None):
        answer = real_get(path, params)
        fetched.append(len(answer.get("text", "")) if isinstance(answer, dict) else 0)
        return answer

    client.get = get
    assert cli.follow_job(client, job.pk, 30, stream=False) == cli.EXIT_TERMINATED
    assert sum(fetched) <= 1 and len(fetched) <= 3


def test_jobs_logs_prints_the_log_as_people_read_it_and_raw_on_request(volt, alice, team_a):
    """`volt jobs logs` printed the stored text: colour codes as escape sequences and progress only as
    `VOLT_EVENT {...}` JSON. It prints the API's readable text now (`--raw`: as stored), also with --tail."""
    from jobs import services as jobs
    from jobs.models import Job
    from jobs.workloads import volt_ckpt

    cluster = Cluster.objects.create(team=team_a, created_by=alice, name="readable", status="terminated",
                                     spec={"nodes": 1, "gpus_per_node": 1, "gpu_models": ["H100"]})  # fmt: skip
    job = Job.objects.create(cluster=cluster, team=team_a, created_by=alice, entrypoint="python t.py",
                             status="succeeded")  # fmt: skip
    raw = (
        "\x1b[36m(TrainRank pid=7)\x1b[0m starting\n"
        + volt_ckpt.event_line("step", step=10, loss=0.5, time=1.7e9) + "\n"
        + volt_ckpt.event_line("checkpoint", step=10, path="/s/step-00000010", shards=2, bytes=2048) + "\n"
    )  # fmt: skip
    jobs.store_log(job, raw.encode(), final=True)
    readable = (
        "(TrainRank pid=7) starting\nstep 10  loss 0.5000\ncheckpoint step 10 saved (2 shards, 2.0 KB)\n"
    )

    assert volt("jobs", "logs", str(job.pk)).out == readable
    assert volt("jobs", "logs", str(job.pk), "--follow").out == readable
    assert volt("jobs", "logs", str(job.pk), "--tail", "2").out == readable.split("\n", 1)[1]
    assert volt("jobs", "logs", str(job.pk), "--raw").out == raw
