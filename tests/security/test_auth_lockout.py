"""Issue 21 point 3c: failed authentications by one caller do not lock others out.

Ten wrong passwords from anywhere locked an account (the platform admin's included) for everyone, and a
bad-token counter per address refused valid tokens of every other caller behind that address. Sign-ins are
now counted per (account, address) and per address; a valid bearer token is never refused for others'
failures. Windows run on a mocked clock (voltweb.throttle.now), never by waiting.
"""

from unittest import mock

import pytest
from django.test import Client

from tests.conftest import api_client
from voltweb import services, throttle

pytestmark = pytest.mark.django_db

T0 = 1_800_000_000.0
ATTACKER, ADMIN_DESK, OFFICE = "203.0.113.66", "198.51.100.7", "192.0.2.10"


@pytest.fixture(autouse=True)
def clock():
    with mock.patch.object(throttle, "now", return_value=T0) as fake:
        yield fake


@pytest.fixture
def limits(settings):
    settings.VOLT_LOGIN_FAILURES_PER_ACCOUNT = 3  # per account, from one address
    settings.VOLT_LOGIN_FAILURES_PER_ADDRESS = 5
    settings.VOLT_TOKEN_FAILURES_PER_ADDRESS = 4
    settings.VOLT_AUTH_THROTTLE_WINDOW_S = 600


def sign_in(username, password, address, path="/login/"):
    client = Client(REMOTE_ADDR=address)
    return client, client.post(path, {"username": username, "password": password})


def test_guessing_the_admins_password_does_not_lock_the_admin_out(root, limits):
    for _ in range(3):
        sign_in("root", "wrong", ATTACKER)

    _, attacker = sign_in("root", "pw-root", ATTACKER)  # even the right password: guessing has stopped
    admin, at_desk = sign_in("root", "pw-root", ADMIN_DESK)

    assert attacker.status_code == 429
    assert at_desk.status_code == 302 and "_auth_user_id" in admin.session


def test_the_admin_site_sign_in_is_not_locked_by_others_either(root, limits):
    for _ in range(3):
        sign_in("root", "wrong", ATTACKER, path="/admin/login/")

    admin, _ = sign_in("root", "pw-root", ADMIN_DESK, path="/admin/login/")

    assert "_auth_user_id" in admin.session


def test_guessing_many_accounts_from_one_address_stops_that_address_only(alice, bob, limits):
    for n in range(5):
        sign_in(f"guess{n}", "wrong", ATTACKER)

    _, attacker = sign_in("bob", "pw-bob", ATTACKER)
    _, elsewhere = sign_in("bob", "pw-bob", OFFICE)

    assert attacker.status_code == 429 and elsewhere.status_code == 302


def bearer(token, address):
    return api_client(token=token).get("/api/v1/teams/", REMOTE_ADDR=address)


def test_a_valid_token_is_never_refused_for_others_bad_tokens_from_its_address(alice, limits):
    good = services.create_api_token(alice, "ci").secret
    for n in range(6):
        bearer(f"volt_guess{n}", OFFICE)

    refused = bearer("volt_guess-again", OFFICE)
    mine = bearer(good, OFFICE)

    assert refused.status_code == 429 and refused.json()["error"]["code"] == "throttled"
    assert mine.status_code == 200
