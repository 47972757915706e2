"""Issue 21 point 2: only members of a cluster's team submit jobs to it; platform admins do not.

The API withholds the cluster's Ray token from platform admins (403 `team_members_only` on the key
download, no token in the hand-off), but a job runs with the cluster's token and storage, so submitting
one read them anyway. Platform admins still see jobs, stop them and terminate clusters.
"""

from __future__ import annotations

import pytest

from clusters.models import Cluster
from jobs import services
from jobs.models import Job
from voltweb import cli
from voltweb import services as accounts

DEMO = {"demo": True, "steps": 5, "seed": 0, "checkpoint_every": 2}


@pytest.fixture
def ready_cluster(team_a, alice):
    return Cluster.objects.create(
        team=team_a, created_by=alice, name="a1", status="ready",
        spec={"nodes": 1, "gpus_per_node": 1, "gpu_models": ["H100"]}, dashboard_url="http://127.0.0.9:1",
    )  # fmt: skip


def assert_members_only(response):
    assert response.status_code == 403, response.content[:300]
    error = response.json()["error"]
    assert error["code"] == "team_members_only"
    assert "Only members of Lab A submit jobs" in error["message"]


@pytest.mark.django_db
def test_a_platform_admin_cannot_submit_through_the_api(root, ready_cluster, client_for):
    response = client_for(root).post("/api/v1/jobs/", {"cluster": ready_cluster.pk, **DEMO}, format="json")

    assert_members_only(response)
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_a_platform_admin_cannot_submit_an_upload_either(root, ready_cluster, client_for):
    from django.core.files.uploadedfile import SimpleUploadedFile

    body = {"cluster": str(ready_cluster.pk), "entrypoint": "python t.py",
            "working_dir": SimpleUploadedFile("wd.zip", b"not even unpacked")}  # fmt: skip
    response = client_for(root).post("/api/v1/jobs/", body, format="multipart")

    assert_members_only(response)  # refused before the archive is looked at
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_the_service_refuses_a_platform_admin_and_accepts_a_member(root, alice, ready_cluster):
    with pytest.raises(services.SubmitRefused) as refused:
        services.submit_job(ready_cluster, root, "python t.py")
    assert refused.value.code == "team_members_only" and refused.value.status == 403

    assert services.submit_job(ready_cluster, alice, "python t.py").status == "pending"


@pytest.mark.django_db
def test_the_console_form_is_refused_to_a_platform_admin(client, root, alice, ready_cluster):
    url = f"/clusters/{ready_cluster.pk}/jobs/new/"
    client.force_login(root)

    assert client.get(url).status_code == 403
    assert client.post(url, {"kind": "demo", "steps": 5, "seed": 0, "checkpoint_every": 2}).status_code == 403
    assert f'href="{url}"' not in client.get(f"/clusters/{ready_cluster.pk}/").content.decode()
    assert not Job.objects.exists()

    client.force_login(alice)
    assert f'href="{url}"' in client.get(f"/clusters/{ready_cluster.pk}/").content.decode()


@pytest.mark.django_db
def test_a_platform_admin_still_sees_and_stops_a_teams_job(root, alice, ready_cluster, client_for):
    job = services.submit_job(ready_cluster, alice, "python t.py")
    api = client_for(root)

    assert api.get(f"/api/v1/jobs/{job.pk}/").status_code == 200
    assert api.post(f"/api/v1/jobs/{job.pk}/stop/").status_code == 202


@pytest.mark.django_db(transaction=True)
def test_the_cli_says_who_may_submit(live_server, root, ready_cluster, monkeypatch, capsys):
    monkeypatch.setenv("VOLT_URL", live_server.url)
    monkeypatch.setenv("VOLT_TOKEN", accounts.create_api_token(root, "ci").secret)

    code = cli.main(["jobs", "submit", "--cluster", str(ready_cluster.pk), "--demo"])

    err = capsys.readouterr().err
    assert code == cli.EXIT_ERROR
    assert "403 team_members_only" in err and "Only members of Lab A submit jobs" in err
    assert not Job.objects.exists()
