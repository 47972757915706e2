"""Issue 9.7: failed sign-ins are throttled per account from one address and per address, failed bearer
tokens per address (a valid token is never refused: issue 21, tests/security/test_auth_lockout.py).

Windows are driven by a mocked clock (voltweb.throttle.now), never by waiting.
"""

from unittest import mock

import pytest
from django.test import Client

from tests.conftest import api_client
from voltweb import services, throttle

pytestmark = pytest.mark.django_db

T0 = 1_800_000_000.0


@pytest.fixture
def clock():
    with mock.patch.object(throttle, "now", return_value=T0) as fake:
        yield fake


@pytest.fixture
def limits(settings):
    settings.VOLT_LOGIN_FAILURES_PER_ACCOUNT = 3
    settings.VOLT_LOGIN_FAILURES_PER_ADDRESS = 5
    settings.VOLT_TOKEN_FAILURES_PER_ADDRESS = 4
    settings.VOLT_AUTH_THROTTLE_WINDOW_S = 600


def sign_in(username, password, address="10.0.0.1"):
    client = Client(REMOTE_ADDR=address)
    return client, client.post("/login/", {"username": username, "password": password})


def test_an_account_is_throttled_from_the_address_that_guessed(alice, limits, clock):
    for _ in range(3):
        _, response = sign_in("alice", "wrong", address="10.0.0.10")
        assert response.status_code == 200  # the form again, with its error

    client, response = sign_in("alice", "pw-alice", address="10.0.0.10")  # the right password
    _, elsewhere = sign_in("alice", "pw-alice", address="10.9.9.9")

    assert response.status_code == 429 and response["Retry-After"] == "600"
    assert "Too many failed sign-ins" in response.content.decode()
    assert "_auth_user_id" not in client.session
    assert elsewhere.status_code == 302  # guessing from one address locks nobody else out


def test_an_address_is_throttled_whatever_the_account(alice, bob, limits, clock):
    for n in range(5):
        sign_in(f"guess{n}", "wrong", address="10.6.6.6")

    _, blocked = sign_in("bob", "pw-bob", address="10.6.6.6")
    _, elsewhere = sign_in("bob", "pw-bob", address="10.7.7.7")

    assert blocked.status_code == 429
    assert elsewhere.status_code == 302


def test_the_window_ends_and_a_success_resets_the_account(alice, limits, clock):
    for _ in range(3):
        sign_in("alice", "wrong", address="10.0.0.2")
    clock.return_value = T0 + 450
    _, waiting = sign_in("alice", "pw-alice", address="10.0.0.2")
    assert waiting.status_code == 429 and waiting["Retry-After"] == "150"

    clock.return_value = T0 + 601
    _, signed_in = sign_in("alice", "pw-alice", address="10.0.0.2")
    assert signed_in.status_code == 302
    _, one_miss = sign_in("alice", "wrong", address="10.0.0.2")
    assert one_miss.status_code == 200  # the count started again


def test_the_admin_sign_in_counts_too(root, limits, clock):
    client = Client(REMOTE_ADDR="10.0.0.5")
    for _ in range(3):
        client.post("/admin/login/", {"username": "root", "password": "wrong"})

    _, response = sign_in("root", "pw-root", address="10.0.0.5")

    assert response.status_code == 429
    # And the admin page itself no longer accepts the right password.
    client.post("/admin/login/", {"username": "root", "password": "pw-root"})
    assert "_auth_user_id" not in client.session


def bearer(token, address):
    client = api_client(token=token)
    return client.get("/api/v1/teams/", REMOTE_ADDR=address)


def test_bad_bearer_tokens_get_429_with_retry_after_in_the_api_error_shape(alice, limits, clock):
    good = services.create_api_token(alice, "ci").secret
    for n in range(4):
        assert bearer(f"volt_guess{n}", "10.1.1.1").status_code == 401

    refused = bearer("volt_guess-again", "10.1.1.1")
    good_but_same_address = bearer(good, "10.1.1.1")

    assert refused.status_code == 429 and refused["Retry-After"] == "600"
    error = refused.json()["error"]
    assert error["code"] == "throttled" and "Too many failed token authentications" in error["message"]
    assert good_but_same_address.status_code == 200  # checked first: others' failures never refuse it
    assert bearer("volt_guess-elsewhere", "10.2.2.2").status_code == 401

    clock.return_value = T0 + 601
    assert bearer("volt_guess-later", "10.1.1.1").status_code == 401


def test_good_tokens_are_never_counted(alice, limits, clock):
    good = services.create_api_token(alice, "ci").secret
    for _ in range(10):
        assert bearer(good, "10.3.3.3").status_code == 200
