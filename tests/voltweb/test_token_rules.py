"""Issue 9.5: tokens cannot mint tokens, expire by default, and the console says when."""

from datetime import timedelta
from unittest import mock

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from tests.conftest import api_client
from voltweb import services
from voltweb.models import ApiToken

pytestmark = pytest.mark.django_db


def test_a_bearer_token_cannot_create_tokens(alice, client_for):
    response = client_for(alice).post("/api/v1/tokens/", {"name": "offspring"}, format="json")

    assert response.status_code == 403
    error = response.json()["error"]
    assert error["code"] == "session_required" and "console session" in error["message"]
    assert ApiToken.objects.filter(user=alice).count() == 1  # only the caller's own token


def test_a_session_creates_tokens_with_the_default_lifetime(alice, settings):
    settings.VOLT_TOKEN_LIFETIME_DAYS = 30
    client = APIClient()
    client.force_login(alice)

    created = client.post("/api/v1/tokens/", {"name": "nightly"}, format="json").json()

    expires = ApiToken.objects.get(pk=created["id"]).expires_at
    assert created["expires_at"] is not None
    assert timedelta(days=29, hours=23) < expires - timezone.now() <= timedelta(days=30)


def test_a_past_expiry_is_400(alice):
    client = APIClient()
    client.force_login(alice)
    past = (timezone.now() - timedelta(hours=1)).isoformat()

    response = client.post("/api/v1/tokens/", {"name": "x", "expires_at": past}, format="json")

    assert response.status_code == 400 and "expires_at" in response.json()["error"]["fields"]


def test_tokens_expire_after_the_default_lifetime(alice):
    issued = services.create_api_token(alice, "ci")
    assert issued.token.expires_at is not None
    assert api_client(token=issued.secret).get("/api/v1/teams/").status_code == 200

    later = timezone.now() + timedelta(days=91)
    with mock.patch("django.utils.timezone.now", return_value=later):
        response = api_client(token=issued.secret).get("/api/v1/teams/")

    assert response.status_code == 401 and "expired" in response.json()["error"]["message"]


def test_the_console_shows_the_lifetime_and_each_expiry(client, alice):
    client.force_login(alice)
    page = client.post("/account/tokens/", {"name": "laptop"}).content.decode()

    token = ApiToken.objects.get(user=alice)
    assert "expire after 90 days" in page
    assert f"It expires on {token.expires_at:%Y-%m-%d %H:%M:%S} UTC" in page
    assert "<th>Expires</th>" in page


def test_the_management_command_token_expires_too(alice, capsys):
    from django.core.management import call_command

    call_command("create_api_token", "alice")
    assert ApiToken.objects.get(user=alice).expires_at is not None
