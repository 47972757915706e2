"""docs/deployment.md's production environment passes `manage.py check --deploy`, and the page cannot drift.

Each check runs `manage.py check --deploy --fail-level WARNING` in a fresh process (a new shell's PATH and
the page's variables, nothing of pytest's: no DJANGO_SETTINGS_MODULE, so voltweb.settings) with the
environment file the page gives, its `<...>` placeholders filled with fresh secrets and its two folders
moved under tmp_path. The page's DATABASE_URL and REDIS_URL are used as written (with a password each, as
volt.W001/W002 require): the check reads settings and connects to neither, so it runs without the hosts.
"""

from __future__ import annotations

import base64
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "deployment.md"
# Where settings (and the beat schedule) read environment variables: env_str("NAME", ...), env_int(...)...
SETTINGS_SOURCES = [REPO / "voltweb" / "settings.py", REPO / "voltweb" / "periodic.py"]
READ = re.compile(r"env_(?:str|bool|int|float|list|url)\(\s*\"([A-Z0-9_]+)\"")


def doc_text() -> str:
    return DOC.read_text()


def env_file() -> dict[str, str]:
    """The page's /etc/volt/volt.env, as written."""
    blocks = re.findall(r"```sh\n# /etc/volt/volt\.env\n(.*?)```", doc_text(), flags=re.S)
    assert len(blocks) == 1, "docs/deployment.md must give /etc/volt/volt.env in one ```sh block"
    pairs = [line.split("=", 1) for line in blocks[0].splitlines() if line and not line.startswith("#")]
    return {name: value for name, value in pairs}


def table_variables() -> list[str]:
    """The first column of the page's table of variables."""
    table = doc_text().split("| variable | example | what for |", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"^\| `([A-Z0-9_]+)` \|", table, flags=re.M)


def settings_variables() -> set[str]:
    return {name for path in SETTINGS_SOURCES for name in READ.findall(path.read_text())}


def documented_env(tmp_path: Path) -> dict[str, str]:
    """A fresh process's environment: PATH and the page's file, secrets filled in, folders in tmp_path."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    for name, value in env_file().items():
        if name == "VOLT_ENCRYPTION_KEY":  # a Fernet key: 32 url-safe base64 bytes
            value = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode()
        env[name] = re.sub(r"<[^>]+>", lambda _: secrets.token_urlsafe(45), value)
    env["VOLT_DATA_DIR"] = str(tmp_path / "data")  # settings create it: not /var/lib/volt on this machine
    env["STATIC_ROOT"] = str(tmp_path / "data" / "static")
    return env


def check_deploy(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_documented_environment_passes_check_deploy_with_the_documented_output(tmp_path):
    env = documented_env(tmp_path)
    assert env["DEBUG"] == "0" and env["BEHIND_TLS_PROXY"] == "1", env
    assert not re.search(r"<[^>]+>", "".join(env.values())), "a placeholder was left unfilled"
    run = check_deploy(env)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert "no issues" in output, output
    expected = re.search(r"check --deploy --fail-level WARNING'\n(.+)\n```", doc_text())
    assert expected, "docs/deployment.md must show the check's output right after its command"
    assert expected.group(1).strip() == output.strip(), (
        f"docs/deployment.md says {expected.group(1)!r}; the check printed {output.strip()!r}"
    )


@pytest.mark.parametrize(
    "variable, message",
    [
        ("SECRET_KEY", "SECRET_KEY must be set (50+ random characters) when DEBUG=0."),
        ("ALLOWED_HOSTS", "ALLOWED_HOSTS must name this server's host names when DEBUG=0."),
    ],
)
def test_without_a_required_variable_settings_refuse_to_load_and_say_which(tmp_path, variable, message):
    env = documented_env(tmp_path)
    del env[variable]
    run = check_deploy(env)
    assert run.returncode != 0, run.stdout + run.stderr
    assert message in run.stderr, run.stderr[-2000:]


def test_service_urls_without_passwords_fail_the_check_as_the_page_says(tmp_path):
    env = documented_env(tmp_path)
    for name in ("DATABASE_URL", "REDIS_URL"):
        env[name] = re.sub(r"//volt:[^@]+@", "//volt@", env[name])
    run = check_deploy(env)
    output = run.stdout + run.stderr
    assert run.returncode == 1, output
    assert "volt.W001" in output and "volt.W002" in output, output
    assert "volt.W001" in doc_text() and "volt.W002" in doc_text()


def test_every_variable_the_page_names_is_one_settings_read():
    named = table_variables()
    assert {"SECRET_KEY", "DATABASE_URL", "REDIS_URL", "BEHIND_TLS_PROXY"} <= set(named), named
    assert len(named) == len(set(named)), f"a variable is in the table twice: {named}"
    unread = sorted(set(named) - settings_variables())
    assert not unread, f"docs/deployment.md names {unread}, which voltweb/settings.py does not read"
    untabled = sorted(set(env_file()) - set(named))
    assert not untabled, f"/etc/volt/volt.env in docs/deployment.md sets {untabled}, missing from its table"


def test_the_documented_workers_consume_every_queue_and_one_beat_runs():
    from django.conf import settings

    from voltweb.celery import app

    text = doc_text()
    consumed = {queue for listed in re.findall(r"QUEUES=([\w,]+)", text) for queue in listed.split(",")}
    assert consumed == set(settings.VOLT_QUEUES) == {queue.name for queue in app.conf.task_queues}, consumed
    beats = re.findall(r"^ExecStart=.*celery -A voltweb beat", text, flags=re.M)
    assert len(beats) == 1, beats
