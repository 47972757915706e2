"""The console's own 404/403/500 pages: what happened and a way back, never Django's debug pages."""

import pytest
from django.core.exceptions import PermissionDenied

from clusters.models import ClusterQuerySet

pytestmark = pytest.mark.django_db

DEBUG_PAGES = ("Using the URLconf", "Traceback", "technical_500", "You're seeing this error because")


@pytest.fixture(params=[True, False], ids=["debug", "production"])
def debug(request, settings):
    settings.DEBUG = request.param
    return request.param


def assert_console_page(response, status: int, heading: str) -> None:
    page = response.content.decode()
    assert response.status_code == status
    assert f"<h1>{heading}</h1>" in page and "Back to the console" in page, page[:500]
    assert not any(text in page for text in DEBUG_PAGES)


def test_unknown_address_shows_the_console_404(client, alice, debug):
    client.force_login(alice)
    assert_console_page(client.get("/no/such/page/"), 404, "Page not found")


def test_another_teams_cluster_is_the_console_404(client, alice, debug):
    client.force_login(alice)
    assert_console_page(client.get("/clusters/999999/"), 404, "Page not found")


def test_a_forbidden_action_shows_the_console_403(client, alice, debug, monkeypatch):
    def refuse(request):
        raise PermissionDenied

    monkeypatch.setattr(ClusterQuerySet, "visible_to", lambda self, user: refuse(None))
    client.force_login(alice)
    assert_console_page(client.get("/clusters/"), 403, "You may not do this")


def test_a_crash_shows_the_console_500_and_logs_the_traceback(client, alice, settings, monkeypatch, caplog):
    settings.DEBUG = True  # production: Django's own handler renders the same template (handler500)

    def crash(user):
        raise RuntimeError("boom in the view")

    monkeypatch.setattr(ClusterQuerySet, "visible_to", lambda self, user: crash(user))
    client.force_login(alice)
    assert_console_page(client.get("/clusters/"), 500, "Something went wrong on our side")
    assert any("boom in the view" in str(r.exc_info[1]) for r in caplog.records if r.exc_info)


def test_api_errors_stay_json(client, alice, debug):
    client.force_login(alice)
    response = client.get("/api/v1/no-such-endpoint/")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


def test_a_missing_trailing_slash_still_redirects(client, alice, debug):
    client.force_login(alice)
    response = client.get("/inventory/hosts")
    assert response.status_code == 301 and response.url == "/inventory/hosts/"
