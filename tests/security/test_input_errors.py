"""Issue 9 point 8: hostile input is a 400 with the API's one error shape (console: a 400 page), never a 500."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from tests.conftest import api_client


def assert_api_400(response, words: str):
    assert response.status_code == 400, response.content[:300]
    error = response.json()["error"]
    assert error["code"] in ("invalid", "parse_error")
    assert words.lower() in error["message"].lower()


@pytest.fixture
def alice_api(alice, client_for):
    return client_for(alice)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "url",
    [
        "/api/v1/hosts/?name=gpu%00",
        "/api/v1/hosts/?ordering=%00",
        "/api/v1/clusters/?team__slug=lab-a%00",
        "/api/v1/providers/north%00wind/",
    ],
)
def test_nul_byte_in_url_is_400(alice_api, url):
    assert_api_400(alice_api.get(url), "NUL")


@pytest.mark.django_db
def test_nul_byte_anywhere_in_json_body_is_400(alice_api):
    for body in (
        {"name": "North\x00wind"},
        {"name": "Northwind", "contact_email": "a@b.example", "extra": {"deep": ["x\x00"]}},
        {"name\x00": "Northwind"},
    ):
        response = alice_api.post("/api/v1/providers/", json.dumps(body), content_type="application/json")
        assert_api_400(response, "NUL")


@pytest.mark.django_db
@pytest.mark.parametrize("depth", [40, 100_000])
def test_deeply_nested_json_is_400(alice_api, depth):
    body = "[" * depth + "]" * depth
    response = alice_api.post("/api/v1/placements/preview", body, content_type="application/json")
    assert_api_400(response, "nested deeper")


@pytest.mark.django_db
def test_body_over_the_size_limit_is_400(alice_api, settings):
    body = json.dumps({"name": "big", "contact_email": "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 10)})
    response = alice_api.post("/api/v1/providers/", body, content_type="application/json")
    assert_api_400(response, "larger than")


@pytest.mark.django_db
def test_body_over_the_limit_without_content_length_is_400(alice_api, settings):
    """DRF reads the stream itself: the parser must bound it even when Content-Length says little."""
    from io import BytesIO

    from rest_framework.exceptions import ParseError

    from voltweb.api.parsers import StrictJSONParser

    raw = b'{"a": "' + b"x" * settings.DATA_UPLOAD_MAX_MEMORY_SIZE + b'"}'
    with pytest.raises(ParseError, match="larger than"):
        StrictJSONParser().parse(BytesIO(raw), parser_context={})


@pytest.mark.django_db
@pytest.mark.parametrize("header", ["\xa0", "Bearer\xa0abc", "Bearer abc\x00", "   "])
def test_malformed_authorization_header_is_400(db, header):
    client = api_client()
    client.credentials(HTTP_AUTHORIZATION=header)
    assert_api_400(client.get("/api/v1/hosts/"), "Authorization")


@pytest.mark.django_db
def test_console_nul_in_query_and_form_is_a_400_page(alice):
    client = Client()
    client.force_login(alice)
    response = client.get("/inventory/hosts/?q=h100%00")
    assert response.status_code == 400
    assert b"Bad request" in response.content and b"NUL" in response.content
    response = client.post("/account/tokens/", {"name": "ci\x00"})
    assert response.status_code == 400
    assert b"NUL" in response.content


# --- issue 21 point 3b: a token's expiry within its lifetime ---------------------------------------------


@pytest.mark.django_db
def test_a_token_expiry_past_the_lifetime_is_400_naming_the_latest_date(alice, settings):
    from datetime import timedelta

    from django.utils import timezone

    from voltweb.models import ApiToken

    settings.VOLT_TOKEN_LIFETIME_DAYS = 90
    client = api_client()
    client.force_login(alice)
    latest = (timezone.now() + timedelta(days=90)).strftime("%Y-%m-%d")

    response = client.post(
        "/api/v1/tokens/", {"name": "x", "expires_at": "2100-01-01T00:00:00Z"}, format="json"
    )

    assert_api_400(response, f"expires_at: may be at most 90 days ahead (VOLT_TOKEN_LIFETIME_DAYS): {latest}")
    assert "expires_at" in response.json()["error"]["fields"]
    assert not ApiToken.objects.filter(user=alice).exists()
    within = (timezone.now() + timedelta(days=89)).isoformat()
    assert (
        client.post("/api/v1/tokens/", {"name": "y", "expires_at": within}, format="json").status_code == 201
    )


# --- issue 21 point 3d: an upload's error says what is wrong in the archive, not where the server keeps it


def _conflicting_archive(kind: str) -> bytes:
    """`a` is a file and `a/b` asks for it to be a folder: unpacking fails on the server's disk."""
    import io
    import tarfile
    import zipfile

    buffer = io.BytesIO()
    if kind == "zip":
        with zipfile.ZipFile(buffer, "w") as archive:
            archive.writestr("a", "x")
            archive.writestr("a/b", "y")
        return buffer.getvalue()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name in ("a", "a/b"):
            info = tarfile.TarInfo(name)
            info.size = 1
            archive.addfile(info, io.BytesIO(b"x"))
    return buffer.getvalue()


@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["zip", "tar.gz"])
def test_an_upload_error_does_not_show_server_paths(alice, team_a, client_for, settings, kind):
    from django.core.files.uploadedfile import SimpleUploadedFile

    from clusters.models import Cluster

    cluster = Cluster.objects.create(team=team_a, created_by=alice, name="a1", status="ready",
                                     spec={"nodes": 1, "gpus_per_node": 1, "gpu_models": ["H100"]})  # fmt: skip
    upload = SimpleUploadedFile(f"wd.{kind}", _conflicting_archive(kind))
    body = {"cluster": str(cluster.pk), "entrypoint": "python t.py", "working_dir": upload}

    response = client_for(alice).post("/api/v1/jobs/", body, format="multipart")

    assert_api_400(response, "working_dir could not be unpacked")
    message = response.json()["error"]["message"]
    assert "Not a directory" in message and "'a/b'" in message  # what is wrong, inside the archive
    for server_path in (str(settings.VOLT_DATA_DIR), "job-workdirs", "uploads/", "/tmp"):
        assert server_path not in message, message


# --- issue 21 point 3e: fields that were accepted although wrong are 400s naming the field ---------------


@pytest.fixture
def ready_cluster(team_a, alice):
    from clusters.models import Cluster

    return Cluster.objects.create(team=team_a, created_by=alice, name="a1", status="ready",
                                  spec={"nodes": 1, "gpus_per_node": 1, "gpu_models": ["H100"]})  # fmt: skip


def assert_field_400(response, field: str, words: str):
    assert_api_400(response, words)
    assert field in response.json()["error"]["fields"], response.json()
    assert response.json()["error"]["message"].startswith(f"{field}: ")


@pytest.mark.django_db
@pytest.mark.parametrize(
    "body, field, words",
    [
        ({"cluster": "$str", "demo": True}, "cluster", "Must be an integer (a cluster id), not str"),
        (
            {"entrypoint": "python t.py", "env": {"LR": 0.1}},
            "env",
            'LR must be a string, not float: write "0.1"',
        ),
        ({"entrypoint": "python t.py", "env": {"N": 3}}, "env", "N must be a string"),
        ({"demo": True, "step_sleep": "NaN"}, "step_sleep", "Must be a number from 0 to 10, not str"),
        ({"demo": True, "step_sleep": "0.5"}, "step_sleep", "Must be a number from 0 to 10, not str"),
        ({"demo": True, "stepz": 5}, "stepz", "Unknown field; this endpoint takes cluster, name, demo"),
    ],
)
def test_job_fields_accepted_before_are_400s(alice_api, ready_cluster, body, field, words):
    from jobs.models import Job

    body = {"cluster": ready_cluster.pk, **body}
    if body["cluster"] == "$str":
        body["cluster"] = str(ready_cluster.pk)

    assert_field_400(alice_api.post("/api/v1/jobs/", body, format="json"), field, words)
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_an_infinite_step_sleep_is_400(alice_api, ready_cluster):
    body = f'{{"cluster": {ready_cluster.pk}, "demo": true, "step_sleep": 1e999}}'  # inf, not a constant

    response = alice_api.post("/api/v1/jobs/", body, content_type="application/json")

    assert_field_400(response, "step_sleep", "Must be a finite number")


@pytest.mark.django_db
def test_a_multipart_submission_is_held_to_the_same_fields(alice_api, ready_cluster):
    base = {"cluster": str(ready_cluster.pk), "demo": "true"}
    assert_field_400(alice_api.post("/api/v1/jobs/", {**base, "step_sleep": "NaN"}, format="multipart"),
                     "step_sleep", "Must be a number from 0 to 10")  # fmt: skip
    assert_field_400(alice_api.post("/api/v1/jobs/", {**base, "cluster": "1x"}, format="multipart"),
                     "cluster", "Must be an integer")  # fmt: skip
    assert_field_400(alice_api.post("/api/v1/jobs/", {**base, "extra": "1"}, format="multipart"),
                     "extra", "Unknown field")  # fmt: skip
    ok = alice_api.post("/api/v1/jobs/", {**base, "step_sleep": "0.5"}, format="multipart")
    assert ok.status_code == 202 and "--step-sleep 0.5" in ok.json()["entrypoint"]


@pytest.fixture
def local_host(northwind, northwind_ib, add_local_host):
    return add_local_host(northwind, northwind_ib, "h0", gpus=8)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "fault, value, words",
    [
        ("hot", "1;id", "GPU indices from 0 to 7"),
        ("gpu_lost", "99", "GPU indices from 0 to 7"),
        ("ecc_uncorrectable", "-1", "GPU indices from 0 to 7"),
        (
            "throttled",
            "-1",
            "throttled takes CPU share (% of one core), a whole number: write a CPU percentage",
        ),
        ("throttled", "99;reboot", "write a CPU percentage from 1 to 100"),
        ("unreachable", "1", "unreachable takes no value"),
    ],
)
def test_host_fault_values_out_of_their_range_are_400s(priya, local_host, client_for, fault, value, words):
    from inventory import services as inventory

    response = client_for(priya).post(
        f"/api/v1/hosts/{local_host.pk}/faults/", {"fault": fault, "value": value}, format="json"
    )

    assert_field_400(response, "value", words)
    assert inventory.active_faults(local_host) == {}


@pytest.mark.django_db
def test_host_fault_values_in_range_are_stored(priya, local_host, client_for):
    from inventory import services as inventory

    url = f"/api/v1/hosts/{local_host.pk}/faults/"
    for fault, value in (("hot", "1,3"), ("gpu_lost", "7"), ("ecc_uncorrectable", ""), ("unreachable", "")):
        assert client_for(priya).post(url, {"fault": fault, "value": value}, format="json").status_code == 200
    assert inventory.active_faults(local_host) == {
        "ecc_uncorrectable": "", "gpu_lost": "7", "hot": "1,3", "unreachable": ""}  # fmt: skip


@pytest.mark.django_db
@pytest.mark.parametrize(
    "drill, value, words",
    [
        ("gpu_lost", "1;id", "GPU indices from 0 to 7"),
        ("gpu_lost", "99", "GPU indices from 0 to 7"),
        ("link_degraded", "-1", "write a percentage of the link rate from 1 to 100"),
        ("unreachable", "yes", "unreachable takes no value"),
    ],
)
def test_drill_values_out_of_their_range_are_400s(
    root, alice, team_a, local_host, client_for, drill, value, words
):
    from clusters.models import Cluster, ClusterNode
    from inventory import services as inventory

    cluster = Cluster.objects.create(team=team_a, created_by=alice, name="d1", status="ready",
                                     spec={"nodes": 1, "gpus_per_node": 8, "gpu_models": ["H100"]})  # fmt: skip
    ClusterNode.objects.create(cluster=cluster, host=local_host, rank=0, is_head=True)

    response = client_for(root).post(
        f"/api/v1/clusters/{cluster.pk}/drills/", {"drill": drill, "rank": 0, "value": value}, format="json"
    )

    assert_field_400(response, "value", words)
    assert inventory.active_faults(local_host) == {}


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["-3.725731641844393e+215", "99999999999999999999", "1.5"])
def test_a_job_list_filtered_by_an_impossible_cluster_id_is_400(alice_api, value):
    """Found by schemathesis' stateful phase: the cluster filter took any decimal, and one beyond the
    database's integers was an OverflowError (a 500)."""
    from urllib.parse import quote

    response = alice_api.get(f"/api/v1/jobs/?cluster={quote(value)}")

    assert response.status_code == 400, response.content[:200]
    assert "cluster" in response.json()["error"]["fields"]
