"""Issue 9.6: an error report (mailed to ADMINS, logged) never shows a submitted key, password or token."""

import logging
from unittest import mock

import asyncssh
import pytest
from django.core import mail
from django.test import Client
from django.utils.log import AdminEmailHandler
from rest_framework.test import APIClient

from inventory.models import Host
from voltweb.models import ApiToken

pytestmark = pytest.mark.django_db


@pytest.fixture
def reports(settings, monkeypatch):
    """Mailed error reports, with the HTML part (it shows every frame's local variables)."""
    settings.ADMINS = [("ops", "ops@volt.example")]
    settings.DEBUG = False
    handlers = [h for h in logging.getLogger("django").handlers if isinstance(h, AdminEmailHandler)]
    assert handlers, "Django's mail_admins handler is not configured"
    for handler in handlers:
        monkeypatch.setattr(handler, "include_html", True)
    mail.outbox.clear()
    return mail.outbox


def private_key() -> tuple[str, list[str]]:
    text = asyncssh.generate_private_key("ssh-ed25519").export_private_key("openssh").decode()
    return text, [line for line in text.splitlines() if "PRIVATE KEY" not in line]


def host_form(block) -> dict:
    return {
        "name": "gpu-07",
        "block": block.pk,
        "driver": "ssh",
        "price_per_gpu_hour": "2.00",
        "address": "10.0.0.7",
        "ssh_port": "22",
        "ssh_user": "volt",
    }


def broken_database():
    return mock.patch.object(Host.objects, "create", side_effect=RuntimeError("database fell over"))


def assert_reported_without(outbox, secret_lines):
    assert len(outbox) == 1
    text, html = outbox[0].body, outbox[0].alternatives[0][0]
    assert "database fell over" in text and "Local Vars" in html  # the report is there, with its frames
    for line in secret_lines:
        assert line not in text and line not in html


def test_console_host_form_error_report_hides_the_private_key(reports, priya, northwind, northwind_ib):
    key, lines = private_key()
    client = Client(raise_request_exception=False)
    client.force_login(priya)

    with broken_database():
        response = client.post(
            f"/inventory/providers/{northwind.slug}/hosts/new/",
            host_form(northwind_ib.blocks.first()) | {"ssh_private_key": key},
        )

    assert response.status_code == 500
    assert_reported_without(reports, lines)
    assert "'ssh_private_key': '********************'" in reports[0].body or (
        "ssh_private_key = '********************'" in reports[0].body
    )


def test_api_host_error_report_hides_the_private_key(reports, priya, northwind, northwind_ib):
    key, lines = private_key()
    client = APIClient(raise_request_exception=False)
    client.force_login(priya)

    with broken_database():
        response = client.post(
            "/api/v1/hosts/",
            host_form(northwind_ib.blocks.first()) | {"provider": "northwind", "ssh_private_key": key},
            format="json",
        )

    assert response.status_code == 500
    assert_reported_without(reports, lines)


def test_login_error_report_hides_the_password(reports, alice):
    client = Client(raise_request_exception=False)
    with mock.patch("voltweb.throttle.login_failed", side_effect=RuntimeError("database fell over")):
        response = client.post("/login/", {"username": "alice", "password": "hunter2-not-hers"})

    assert response.status_code == 500
    assert_reported_without(reports, ["hunter2-not-hers"])


def test_token_page_error_report_hides_the_new_token(reports, alice):
    client = Client(raise_request_exception=False)
    client.force_login(alice)
    fails_after_creating = mock.patch.object(
        ApiToken.objects, "filter", side_effect=RuntimeError("database fell over")
    )

    with mock.patch("voltweb.services.secrets.token_urlsafe", return_value="fixed-secret-for-this-test"):
        with fails_after_creating:
            response = client.post("/account/tokens/", {"name": "laptop"})

    assert response.status_code == 500
    assert_reported_without(reports, ["fixed-secret-for-this-test"])
