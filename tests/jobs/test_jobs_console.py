"""Console pages of jobs without Ray: the cluster page's jobs section, the submit form (demo and custom,
errors shown on the form), the job page, stop; and the CLI's argument handling."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from clusters.models import Cluster
from jobs import services
from jobs.models import Job
from voltweb import cli

pytestmark = pytest.mark.django_db


@pytest.fixture
def ready_cluster(team_a, alice):
    return Cluster.objects.create(
        team=team_a, created_by=alice, name="a1", status="ready",
        spec={"nodes": 2, "gpus_per_node": 1, "gpu_models": ["H100"]}, dashboard_url="http://127.0.0.9:1",
    )  # fmt: skip


def test_cluster_page_offers_the_submit_form_and_lists_its_jobs(client, alice, ready_cluster):
    client.force_login(alice)
    job = services.submit_job(ready_cluster, alice, "python t.py", name="sweep")
    page = client.get(f"/clusters/{ready_cluster.pk}/").content.decode()
    assert (
        f"/clusters/{ready_cluster.pk}/jobs/new/" in page
        and f'data-job="{job.pk}"' in page
        and "sweep" in page
    )


def test_demo_from_the_form_lands_on_the_job_page(client, alice, ready_cluster):
    client.force_login(alice)
    form = client.get(f"/clusters/{ready_cluster.pk}/jobs/new/").content.decode()
    assert "Demo workload" in form and 'name="seed"' in form
    response = client.post(f"/clusters/{ready_cluster.pk}/jobs/new/", {
        "kind": "demo", "steps": 20, "seed": 4, "step_sleep": 0.1, "checkpoint_every": 5, "env": "A=1\n"})  # fmt: skip
    job = Job.objects.get()
    assert (
        response.status_code == 302 and response["Location"] == f"/clusters/{ready_cluster.pk}/jobs/{job.pk}/"
    )
    assert (
        job.is_demo
        and job.env == {"A": "1"}
        and "--seed 4" in job.entrypoint
        and "--step-sleep 0.1" in job.entrypoint
    )
    page = client.get(response["Location"]).content.decode()
    assert 'id="job-log"' in page and 'id="checkpoints-table"' in page and "job_live.js" in page


def test_custom_job_with_an_upload_and_form_errors(client, alice, ready_cluster):
    client.force_login(alice)
    url = f"/clusters/{ready_cluster.pk}/jobs/new/"
    missing = client.post(url, {"kind": "custom", "steps": 1, "seed": 0, "checkpoint_every": 5})
    assert missing.status_code == 400 and "Give the command to run" in missing.content.decode()
    bad_env = client.post(url, {"kind": "custom", "entrypoint": "python t.py", "steps": 1, "seed": 0,
                                "checkpoint_every": 5, "env": "VOLT_JOB_ID=3"})  # fmt: skip
    assert bad_env.status_code == 400 and "set by Volt or Ray" in bad_env.content.decode()
    wrong = SimpleUploadedFile("wd.7z", b"x")
    refused = client.post(url, {"kind": "custom", "entrypoint": "python t.py", "steps": 1, "seed": 0,
                                "checkpoint_every": 5, "working_dir": wrong})  # fmt: skip
    assert refused.status_code == 400 and ".zip or .tar.gz" in refused.content.decode()
    assert not Job.objects.exists()


def test_another_team_gets_404s_and_stop_from_the_page(client, alice, bob, ready_cluster):
    job = services.submit_job(ready_cluster, alice, "python t.py")
    client.force_login(bob)
    assert client.get(f"/clusters/{ready_cluster.pk}/jobs/{job.pk}/").status_code == 404
    assert client.post(f"/clusters/{ready_cluster.pk}/jobs/{job.pk}/stop/").status_code == 404
    assert client.get(f"/clusters/{ready_cluster.pk}/jobs/new/").status_code == 404
    client.force_login(alice)
    client.post(f"/clusters/{ready_cluster.pk}/jobs/{job.pk}/stop/")
    assert Job.objects.get(pk=job.pk).status == "stopped"
    assert "Jobs" in client.get("/jobs/").content.decode()


def test_cli_submit_needs_a_command_or_demo(monkeypatch, capsys):
    monkeypatch.setenv("VOLT_TOKEN", "volt_x")
    monkeypatch.setenv("VOLT_URL", "http://127.0.0.1:9")
    assert cli.main(["jobs", "submit", "--cluster", "3"]) == cli.EXIT_ERROR
    assert "give the command to run after --" in capsys.readouterr().err
    assert cli.main(["jobs", "submit", "--cluster", "3", "--env", "NOEQUALS", "--", "python", "t.py"]) == 1
    assert "--env 'NOEQUALS': write NAME=value" in capsys.readouterr().err


def test_the_whole_log_downloads_as_a_file_for_the_team_only(client, alice, bob, ready_cluster):
    """The job page opens a long log at its end; the whole log (every stored chunk, in order) downloads."""
    job = services.submit_job(ready_cluster, alice, "python t.py")
    lines = [f"line {i} — é ✓\n" for i in range(3000)]
    for start in range(0, 3000, 100):  # 30 chunks, as 30 polls store them
        services.store_log(job, "".join(lines[start : start + 100]).encode(), final=False)
    client.force_login(alice)
    page = client.get(f"/clusters/{ready_cluster.pk}/jobs/{job.pk}/").content.decode()
    assert f'data-log-size="{job.log_size}"' in page and f'data-log-tail="{services.LOG_PAGE_MAX}"' in page
    assert f"/clusters/{ready_cluster.pk}/jobs/{job.pk}/log.txt" in page and "Show earlier lines" in page
    response = client.get(f"/clusters/{ready_cluster.pk}/jobs/{job.pk}/log.txt")
    assert response.status_code == 200 and response["Content-Type"] == "text/plain; charset=utf-8"
    assert f'filename="job-{job.pk}.log"' in response["Content-Disposition"]
    assert b"".join(response.streaming_content).decode() == "".join(lines)
    client.force_login(bob)  # another team's
    assert client.get(f"/clusters/{ready_cluster.pk}/jobs/{job.pk}/log.txt").status_code == 404


def test_checkpoint_rows_name_their_place_as_the_connect_box_names_storage(client, alice, team_a):
    """The job page's checkpoint location is under the path the cluster's connect box gives for shared
    storage, not this machine's folder behind it (a local-host scan records /var/…/shared-storage/…)."""
    import re

    from clusters.tenancy import ray_cluster_id, shared_storage_dir
    from jobs.models import Checkpoint

    cluster = Cluster.objects.create(
        team=team_a, created_by=alice, name="a1", status="ready", spec={"nodes": 1, "gpus_per_node": 1},
        ray_address="127.0.0.9:2", dashboard_url="http://127.0.0.9:1",
    )  # fmt: skip
    Cluster.objects.filter(pk=cluster.pk).update(
        storage_path=f"~/volt/clusters/{ray_cluster_id(cluster)}/storage"
    )
    job = services.submit_job(cluster, alice, "python t.py")
    host_path = shared_storage_dir(cluster) / "jobs" / str(job.pk) / "checkpoints" / "step-00000010"
    Checkpoint.objects.create(job=job, step=10, path=str(host_path), synchronized=True)
    client.force_login(alice)

    cluster_page = client.get(f"/clusters/{cluster.pk}/").content.decode()
    storage = re.search(r'Shared storage</span><span class="mono">([^<]+)</span>', cluster_page).group(1)
    job_page = client.get(f"/clusters/{cluster.pk}/jobs/{job.pk}/").content.decode()
    row = re.search(r'<table[^>]* id="checkpoints-table".*?</table>', job_page, re.S).group(0)
    assert storage.startswith("~/") and f"{storage}/jobs/{job.pk}/checkpoints/step-00000010" in row
    assert str(host_path) not in job_page


def test_without_javascript_the_form_shows_every_fieldset_and_demo_ignores_an_entrypoint(
    client, alice, ready_cluster
):
    """volt.js hides the entrypoint fieldset while the demo is chosen; without it the fieldset shows and a
    demo submission with an entrypoint typed runs the demo."""
    client.force_login(alice)
    url = f"/clusters/{ready_cluster.pk}/jobs/new/"
    form = client.get(url).content.decode()
    assert '<fieldset id="custom-fields" data-shown-when="kind=custom">' in form
    client.post(
        url, {"kind": "demo", "entrypoint": "python mine.py", "steps": 5, "seed": 0, "checkpoint_every": 5}
    )
    job = Job.objects.get()
    assert job.is_demo and "mine.py" not in job.entrypoint


def test_a_custom_job_needs_none_of_the_demos_fields_and_a_demo_needs_them(client, alice, ready_cluster):
    """The demo's fieldset is hidden and disabled while "My entrypoint" is chosen, so the browser sends no
    steps or seed: the form takes the custom job, and refuses a demo that lacks them, naming the field."""
    client.force_login(alice)
    url = f"/clusters/{ready_cluster.pk}/jobs/new/"
    assert '<fieldset id="demo-fields" data-shown-when="kind=demo">' in client.get(url).content.decode()
    demo = client.post(url, {"kind": "demo", "checkpoint_every": 5})
    assert demo.status_code == 400 and "Required for the demo workload." in demo.content.decode()
    assert not Job.objects.exists()
    custom = client.post(url, {"kind": "custom", "entrypoint": "python t.py", "checkpoint_every": 5})
    job = Job.objects.get()
    assert custom.status_code == 302 and job.entrypoint == "python t.py" and not job.is_demo
