"""Issue 21 point 3h: a multipart job POST that Twisted's form parser rejects answers the API's JSON error.

daphne serves HTTP through Twisted, which parsed every multipart POST body itself before handing the raw
body to Django, and answered one it could not parse (an empty form: no parts) with a bare 400 with no
body. Only a real daphne shows it: this starts one (no database needed: the calls are anonymous).
Run it alone (it starts a server): `flock /tmp/volt-heavy.lock pytest tests/security/test_daphne_forms.py`.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request

import pytest

from tests.security.live_api import BIN, REPO_ROOT, LiveApi, _stop, _wait_until_up, free_port

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def daphne(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("daphne")
    env = os.environ | {
        "DJANGO_SETTINGS_MODULE": "voltweb.settings_test",
        "DATABASE_URL": f"sqlite:///{tmp / 'unused.sqlite3'}",
        "VOLT_DATA_DIR": str(tmp / "data"),
        "CELERY_BROKER_URL": "memory://",
    }
    port, log = free_port(), tmp / "daphne.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(port), "voltweb.asgi:application"],
            cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    api = LiveApi(url=f"http://127.0.0.1:{port}", tokens={}, log=log)
    try:
        _wait_until_up(api, server)
        yield api
    finally:
        _stop(server)


def post(api: LiveApi, body: bytes, content_type: str) -> tuple[int, str, bytes]:
    request = urllib.request.Request(
        f"{api.url}/api/v1/jobs/", data=body, method="POST", headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Content-Type", ""), error.read()


@pytest.mark.parametrize(
    "body, content_type",
    [
        (b"--xyz--\r\n", "multipart/form-data; boundary=xyz"),  # an empty form: no parts
        (b"", "multipart/form-data; boundary=xyz"),
        (b"not a multipart body at all", "multipart/form-data; boundary=xyz"),
        (b"--xyz--\r\n", "multipart/form-data"),  # no boundary
    ],
)
def test_a_multipart_post_twisted_cannot_parse_gets_the_json_error_shape(daphne, body, content_type):
    status, kind, content = post(daphne, body, content_type)

    assert status in (400, 401), (status, content, daphne.log_tail())
    assert kind.startswith("application/json"), (status, kind, content)
    error = json.loads(content)["error"]
    assert error["code"] and error["message"]
