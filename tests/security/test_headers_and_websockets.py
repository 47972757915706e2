"""Issue 9 point 15: unknown websocket paths close cleanly; every page carries a Content-Security-Policy."""

from __future__ import annotations

import re

import pytest
from channels.testing import WebsocketCommunicator
from django.test import Client

from voltweb.asgi import application


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize("path", ["/ws/nope/", "/ws/hosts/abc/", "/", "/ws/clusters/1/x/"])
async def test_unknown_websocket_path_is_a_clean_4404_close(path):
    """Through the full ASGI stack (origin check, session auth) as a browser would connect."""
    comm = WebsocketCommunicator(
        application, path, headers=[(b"origin", b"http://localhost"), (b"host", b"localhost")]
    )
    connected, code = await comm.connect(timeout=5)
    assert not connected
    assert code == 4404
    await comm.disconnect()


def _policy(response) -> dict[str, str]:
    header = response["Content-Security-Policy"]
    return {d.split()[0]: d for d in (part.strip() for part in header.split(";")) if d}


@pytest.mark.django_db
@pytest.mark.parametrize("url", ["/login/", "/inventory/", "/inventory/hosts/", "/clusters/", "/api/docs/"])
def test_pages_carry_a_nonce_content_security_policy(alice, url):
    client = Client()
    client.force_login(alice)
    response = client.get(url, follow=True)
    assert response.status_code == 200
    policy = _policy(response)
    assert "'unsafe-inline'" not in policy["script-src"] and "'unsafe-eval'" not in policy["script-src"]
    assert policy["object-src"] == "object-src 'none'"
    assert policy["frame-ancestors"] == "frame-ancestors 'none'"
    nonce = re.search(r"'nonce-([^']+)'", policy["script-src"]).group(1)
    html = response.content.decode()
    # Every inline script carries this response's nonce; inline event handlers would be blocked.
    for tag in re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", html):
        assert "application/json" in tag or f'nonce="{nonce}"' in tag, tag
    assert not re.search(r"\son(click|change|submit|load)=", html)


@pytest.mark.django_db
def test_each_response_gets_its_own_nonce(alice):
    client = Client()
    client.force_login(alice)
    first = _policy(client.get("/inventory/hosts/"))["script-src"]
    second = _policy(client.get("/inventory/hosts/"))["script-src"]
    assert first != second


@pytest.mark.django_db
def test_api_json_has_no_page_policy(alice, client_for):
    response = client_for(alice).get("/api/v1/hosts/")
    assert response.status_code == 200
    assert "Content-Security-Policy" not in response
