"""Bearer tokens: what a CI pipeline sees when it authenticates, and when its token is revoked."""

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from tests.conftest import api_client
from voltweb import services
from voltweb.models import ApiToken

pytestmark = pytest.mark.django_db


def test_token_authenticates_and_records_last_use(alice):
    issued = services.create_api_token(alice, "ci")

    response = api_client(token=issued.secret).get("/api/v1/offers/")

    assert response.status_code == 200
    issued.token.refresh_from_db()
    assert issued.token.last_used_at is not None


def test_only_a_hash_of_the_token_is_stored(alice):
    issued = services.create_api_token(alice, "ci")
    stored = ApiToken.objects.get(pk=issued.token.pk)
    assert issued.secret not in (stored.token_hash, stored.prefix)
    assert stored.token_hash == services.hash_token(issued.secret)


def test_revoked_token_gets_401_with_a_message(alice):
    issued = services.create_api_token(alice, "ci")
    services.revoke_api_token(issued.token)

    response = api_client(token=issued.secret).get("/api/v1/hosts/")

    assert response.status_code == 401
    assert response.json()["error"]["code"] == "authentication_failed"
    assert "revoked" in response.json()["error"]["message"]


def test_unauthenticated_call_gets_401_with_bearer_challenge(db):
    response = api_client().get("/api/v1/hosts/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"
    assert response.json()["error"]["code"] == "not_authenticated"


@pytest.mark.parametrize("header", ["Bearer", "Bearer a b", "Bearer volt_not-a-real-token", "Bearer nope"])
def test_malformed_or_unknown_tokens_get_401(alice, header):
    client = api_client()
    client.credentials(HTTP_AUTHORIZATION=header)
    assert client.get("/api/v1/hosts/").status_code == 401


def test_inactive_user_token_fails(alice):
    issued = services.create_api_token(alice, "ci")
    alice.is_active = False
    alice.save()
    assert api_client(token=issued.secret).get("/api/v1/hosts/").status_code == 401


def test_tokens_are_created_and_revoked_through_the_api(alice):
    client = APIClient()
    client.force_login(alice)  # a console session: tokens cannot mint tokens

    created = client.post("/api/v1/tokens/", {"name": "nightly"}, format="json")
    assert created.status_code == 201
    secret = created.json()["token"]
    assert secret.startswith("volt_")
    assert api_client(token=secret).get("/api/v1/teams/").status_code == 200

    listed = client.get("/api/v1/tokens/").json()["results"]
    assert "token" not in listed[0]  # the secret is never shown again
    revoked = client.post(f"/api/v1/tokens/{created.json()['id']}/revoke/")
    assert revoked.status_code == 200 and revoked.json()["is_active"] is False
    assert api_client(token=secret).get("/api/v1/teams/").status_code == 401


def test_another_users_token_is_a_404(alice, bob, client_for):
    bobs = services.create_api_token(bob, "bob's")
    assert client_for(alice).post(f"/api/v1/tokens/{bobs.token.pk}/revoke/").status_code == 404


def test_create_api_token_command_prints_a_working_token_once(alice, capsys):
    call_command("create_api_token", "alice", "--name", "ops")
    secret = capsys.readouterr().out.strip()
    assert api_client(token=secret).get("/api/v1/offers/").status_code == 200
    assert ApiToken.objects.get(user=alice).name == "ops"


def test_create_api_token_command_names_the_missing_user(db):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="No user named 'ghost'"):
        call_command("create_api_token", "ghost")


def test_console_token_page_shows_secret_once_and_revokes(client, alice):
    client.force_login(alice)
    page = client.post("/account/tokens/", {"name": "laptop"})
    secret = page.context["issued"].secret
    assert secret in page.content.decode()
    assert secret not in client.get("/account/tokens/").content.decode()

    token = ApiToken.objects.get(user=alice)
    client.post(f"/account/tokens/{token.pk}/revoke/")
    assert api_client(token=secret).get("/api/v1/offers/").status_code == 401
