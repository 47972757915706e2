"""Telemetry without Ray: health rules, metric storage and retention, the metrics and probe API.

The Ray job API is the seam for the probe (its logs are given, as in test_verification.py).
"""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from clusters import provision, transitions
from clusters.models import Cluster, MetricMinute, MetricSample
from clusters.probes import allreduce
from clusters.telemetry import bandwidth_watch, health, metrics
from inventory.discovery.types import GpuInfo

from .conftest import spec

pytestmark = pytest.mark.django_db


def gpu(index=0, **values) -> GpuInfo:
    return GpuInfo(index=index, uuid=f"GPU-{index}", name="NVIDIA H100", model="H100", **values)


HEALTHY = health.HostReading(True, gpus=(gpu(0, temperature_c=40, utilization_pct=50),), ray_alive=True)


@pytest.mark.parametrize(
    ("reading", "is_head", "head_error", "head_state", "verdict", "rule"),
    [
        (HEALTHY, False, None, "ALIVE", "ok", ""),
        (health.HostReading(False, error="not answering"), False, None, "ALIVE", "failed", "host unreachable"),
        (HEALTHY, True, "refused", None, "failed", "Ray head not answering"),
        (HEALTHY, False, "refused", None, "ok", ""),  # a worker is judged on its own when the head is down
        (HEALTHY, False, None, "DEAD", "failed", "lists this node as DEAD"),
        (HEALTHY, False, None, None, "failed", "lists this node as missing"),
        (health.HostReading(True, ray_alive=False), False, None, "ALIVE", "failed", "not running"),
        (health.HostReading(True, gpus=(gpu(1, ecc_uncorrectable=4),), ray_alive=True), False, None, "ALIVE",
         "failed", "GPU 1: 4 uncorrectable ECC"),
        (health.HostReading(True, lost=("Unable to determine",), ray_alive=True), False, None, "ALIVE",
         "failed", "GPU lost"),
        (health.HostReading(True, gpus=(gpu(0, temperature_c=96),), ray_alive=True), False, None, "ALIVE",
         "failed", "96 C (limit 90 C)"),
        (health.HostReading(True, gpus=(gpu(0, temperature_c=87),), ray_alive=True), False, None, "ALIVE",
         "warning", "warning above 85 C"),
        (health.HostReading(True, smi_error="garbage", ray_alive=True), False, None, "ALIVE", "warning",
         "nvidia-smi unreadable"),
    ],
)  # fmt: skip
def test_each_rule_gives_its_verdict(reading, is_head, head_error, head_state, verdict, rule):
    judgement = health.judge(reading, is_head=is_head, head_error=head_error, head_state=head_state)
    assert judgement.verdict == verdict and rule in judgement.rule


def test_the_host_a_flagged_probe_blames_warns_of_its_link_and_a_failure_still_comes_first():
    link = "link: the bandwidth probe blames this host (best link 0.012 GB/s, 25% of the others' 0.05 GB/s)"

    warned = health.judge(HEALTHY, is_head=False, head_error=None, head_state="ALIVE", link=link)
    dead = health.judge(HEALTHY, is_head=False, head_error=None, head_state="DEAD", link=link)

    assert (warned.verdict, warned.rule) == ("warning", link)
    assert dead.verdict == "failed" and "DEAD" in dead.rule


def test_readings_summarize_the_nodes_gpus():
    reading = health.HostReading(
        True, ray_alive=True, gpus=(gpu(0, temperature_c=40, utilization_pct=20, power_draw_w=100.0),
                                    gpu(1, temperature_c=60, utilization_pct=80, power_draw_w=200.0)),
    )  # fmt: skip
    figures = health.summarize(reading)
    assert (figures["gpu_temp_c"], figures["gpu_util_pct"], figures["gpu_power_w"]) == (60, 50.0, 300.0)


@pytest.fixture
def ready(alice, rack, client_for, committed):
    """A READY 2-node cluster (as far as Volt knows: its head is a closed port)."""
    with committed():
        response = client_for(alice).post("/api/v1/clusters/", spec(), format="json")
    Cluster.objects.filter(pk=response.json()["id"]).update(dashboard_url="http://127.0.0.1:1")
    cluster = transitions.transition(Cluster.objects.get(pk=response.json()["id"]), "verifying", "joined")
    return transitions.transition(cluster, "ready", "probe passed", extra={"ready_at": timezone.now()})


def test_compaction_folds_minutes_and_applies_both_retentions(ready, settings):
    now = timezone.now().replace(second=30, microsecond=0)
    old = now - timedelta(hours=settings.VOLT_METRICS_RAW_RETENTION_H, minutes=5)
    for seconds, value in ((0, 10.0), (10, 20.0), (20, 60.0)):
        metrics.record(ready, "busbw", value, source="probe", ts=old.replace(second=seconds))
    metrics.record(ready, "busbw", 5.0, source="probe", ts=now - timedelta(minutes=2))
    MetricMinute.objects.create(cluster=ready, series="busbw", source="probe", count=1, mean=1, minimum=1,
                                maximum=1, minute=now - timedelta(days=31))  # fmt: skip

    result = metrics.compact(now=now)

    minute = MetricMinute.objects.get(minute=old.replace(second=0))
    assert (minute.count, minute.mean, minute.minimum, minute.maximum) == (3, 30.0, 10.0, 60.0)
    assert result["raw_deleted"] == 3 and result["minutes_deleted"] == 1
    assert list(MetricSample.objects.values_list("value", flat=True)) == [5.0]  # within a day: kept raw
    assert metrics.compact(now=now)["minutes"] >= 1  # idempotent: recomputed, not duplicated
    assert MetricMinute.objects.filter(minute=old.replace(second=0)).count() == 1
    points = metrics.series(ready, "busbw", now - timedelta(days=2), now)
    assert [(p.value, p.aggregated) for p in points] == [(30.0, True), (5.0, False)]


def test_metrics_api_reads_a_series_for_a_range_and_hides_other_teams_clusters(ready, alice, bob, client_for):
    metrics.record(ready, "busbw", 42.5, source="probe")
    metrics.record(ready, "gpu_temp_c", 40, host=provision.active_nodes(ready)[0].host)
    since = (timezone.now() - timedelta(minutes=5)).isoformat()

    response = client_for(alice).get(
        f"/api/v1/clusters/{ready.pk}/metrics/", {"series": "busbw", "since": since}
    )

    assert response.status_code == 200, response.json()
    body = response.json()
    assert [(p["value"], p["source"]) for p in body["points"]] == [(42.5, "probe")]
    assert body["predicted_busbw_gbps"] == ready.predicted_busbw_gbps
    assert client_for(bob).get(f"/api/v1/clusters/{ready.pk}/metrics/").status_code == 404
    bad = client_for(alice).get(f"/api/v1/clusters/{ready.pk}/metrics/", {"series": "nope"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid"


def test_metrics_and_probe_are_in_the_schema(client):
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    metrics_op = schema["paths"]["/api/v1/clusters/{id}/metrics/"]["get"]
    assert {p["name"] for p in metrics_op["parameters"]} >= {"series", "since", "until"}
    assert "202" in schema["paths"]["/api/v1/clusters/{id}/probe/"]["post"]["responses"]


def probe_logs(cluster: Cluster, local_gbps: list[float], busbw: float) -> str:
    ips = [n.host.address for n in provision.active_nodes(cluster)]
    time_s = allreduce.MB / (busbw / (2 * (len(ips) - 1) / len(ips))) / 1e9
    summary = allreduce.summarize(
        len(ips), "gloo", [allreduce.MB], [[time_s]] * len(ips), node_ips=ips, correct=True,
        hosts=allreduce.summarize_hosts(ips, local_gbps, [(0, 1, 1.0)]),
    )  # fmt: skip
    return "job output\n" + allreduce.RESULT_PREFIX + json.dumps(summary) + "\n"


def test_probe_on_demand_stores_a_sample_and_alerts_naming_the_slow_host(
    ready, alice, client_for, committed, probe_hosts
):
    slow_host = provision.active_nodes(ready)[1].host
    probe_hosts.answer(probe_logs(ready, [10.0, 1.0], busbw=ready.predicted_busbw_gbps * 0.1))

    with committed():
        response = client_for(alice).post(f"/api/v1/clusters/{ready.pk}/probe/")

    assert response.status_code == 202
    cluster = Cluster.objects.get(pk=ready.pk)
    assert f"slowest host: {slow_host.name}" in cluster.bandwidth_alert and "10%" in cluster.bandwidth_alert
    assert MetricSample.objects.get(cluster=cluster, series="busbw").source == "probe"
    assert cluster.last_probe_at is not None

    probe_hosts.answer(probe_logs(ready, [10.0, 10.0], busbw=ready.predicted_busbw_gbps * 0.9))
    with committed():
        client_for(alice).post(f"/api/v1/clusters/{ready.pk}/probe/")
    assert Cluster.objects.get(pk=ready.pk).bandwidth_alert == ""  # back above the fraction: cleared


def test_probe_of_a_cluster_that_is_not_ready_is_a_409(alice, rack, client_for, committed):
    with committed():
        cluster_id = client_for(alice).post("/api/v1/clusters/", spec(), format="json").json()["id"]
    response = client_for(alice).post(f"/api/v1/clusters/{cluster_id}/probe/")
    assert response.status_code == 409 and response.json()["error"]["code"] == "not_ready"


def test_idle_probes_follow_the_per_cluster_interval(ready, alice, client_for, settings, monkeypatch):
    queued = []
    monkeypatch.setattr("clusters.tasks.probe_cluster_task.delay", queued.append)
    monkeypatch.setattr(bandwidth_watch, "job_running", lambda cluster: False)
    later = timezone.now() + timedelta(minutes=settings.VOLT_PROBE_INTERVAL_MIN + 1)

    assert bandwidth_watch.probe_idle_clusters(now=timezone.now()) == 0  # just became ready
    assert bandwidth_watch.probe_idle_clusters(now=later) == 1 and queued == [ready.pk]

    response = client_for(alice).patch(
        f"/api/v1/clusters/{ready.pk}/probe-settings/", {"probe_interval_min": 0}, format="json"
    )
    assert response.status_code == 200 and response.json()["probe_interval_min"] == 0
    assert bandwidth_watch.probe_idle_clusters(now=later) == 0  # off: not queued again
    assert queued == [ready.pk]


@pytest.fixture
def fake_head():
    """An HTTP server standing in for a Ray head's job API (the outer seam); `jobs` is what it lists."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    jobs: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = json.dumps(jobs).encode()
            self.send_response(200 if self.path == "/api/jobs/" else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", jobs
    server.shutdown()


def test_a_running_job_holds_the_cluster(ready, fake_head):
    url, jobs = fake_head
    Cluster.objects.filter(pk=ready.pk).update(dashboard_url=url)
    ready.refresh_from_db()
    jobs.append({"status": "SUCCEEDED", "entrypoint": "python train.py"})
    assert not bandwidth_watch.job_running(ready)
    jobs.append({"status": "RUNNING", "entrypoint": "python train.py"})
    assert bandwidth_watch.job_running(ready)
    Cluster.objects.filter(pk=ready.pk).update(dashboard_url="http://127.0.0.1:1")
    ready.refresh_from_db()
    assert bandwidth_watch.job_running(ready)  # a head that does not answer: not idle, no probe


def test_the_live_probe_is_sized_to_the_probe_budget_as_verification_is(ready, settings, probe_hosts):
    """Issue 12: "the verification probe, light (its time budget)" — not a fixed message-size cap."""
    settings.VOLT_PROBE_BUDGET_S = 7.0
    probe_hosts.answer(probe_logs(ready, [10.0, 10.0], busbw=ready.predicted_busbw_gbps))

    bandwidth_watch.run_probe(ready.pk)

    plan = allreduce.budget_plan(ready.predicted_busbw_gbps, 7.0, 2, settings.VOLT_PROBE_ITERS, 2,
                                 settings.VOLT_PROBE_MAX_MB * allreduce.MB)  # fmt: skip
    assert probe_hosts.argument("--budget-s") == "7"
    assert probe_hosts.argument("--sizes") == ",".join(str(size) for size in plan.sizes)


def test_after_an_on_demand_probe_every_figure_on_the_page_and_api_is_the_new_probes(
    ready, alice, client_for, committed, probe_hosts
):
    """Issue 23: after "Probe bandwidth now" the headline read the new figure while the size table, the
    sentence under it and the API's `probe_result` still showed the READY probe's rows; small figures
    printed as "0.0 GB/s" on the timeline."""
    first = ready.predicted_busbw_gbps * 0.9
    probe_hosts.answer(probe_logs(ready, [10.0, 10.0], busbw=first))
    with committed():
        client_for(alice).post(f"/api/v1/clusters/{ready.pk}/probe/")
    slow = 0.0134
    probe_hosts.answer(probe_logs(ready, [10.0, 10.0], busbw=slow))
    with committed():
        client_for(alice).post(f"/api/v1/clusters/{ready.pk}/probe/")

    api = client_for(alice).get(f"/api/v1/clusters/{ready.pk}/").json()
    assert api["measured_busbw_gbps"] == pytest.approx(slow)
    assert api["probe_result"]["max_busbw_gbps"] == pytest.approx(slow)
    assert [row["busbw_gbps"] for row in api["probe_result"]["results"]] == [pytest.approx(slow)]
    browser = Client()
    browser.force_login(alice)
    page = browser.get(f"/clusters/{ready.pk}/").content.decode()
    assert "max busbw <strong>0.013 GB/s</strong>" in page
    assert '<td class="num">0.013</td></tr>' in page  # the size table: the new probe's row
    assert api["bandwidth_flagged"] and "below expectation" in page
    timeline = [
        e["message"] for e in client_for(alice).get(f"/api/v1/clusters/{ready.pk}/events/").json()["results"]
    ]
    assert any("max busbw 0.013 GB/s" in line for line in timeline), timeline
    assert not any(re.search(r"(?<![0-9])0\.0 GB/s", line) for line in timeline), timeline
