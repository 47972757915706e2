"""Start-up configuration: clear failures on bad values, a clean deploy check, a clean OpenAPI schema."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = {
    "DEBUG": "0",
    "SECRET_KEY": "x" * 20 + "-production-secret-with-enough-entropy-0123456789",
    "ALLOWED_HOSTS": "volt.example.com",
    "DATABASE_URL": "postgres://volt:db-password@db.internal:5432/volt",
    "REDIS_URL": "redis://volt:redis-password@redis.internal:6379/0",
}


def manage(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in PRODUCTION}
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DEBUG": "maybe"}, "DEBUG='maybe' is not a boolean"),
        ({"DATABASE_URL": "mysql://x/y"}, "DATABASE_URL='mysql://x/y' has scheme 'mysql'"),
        ({"REDIS_URL": "http://localhost"}, "REDIS_URL='http://localhost' has scheme 'http'"),
        ({"CELERY_TASK_TIME_LIMIT": "ten"}, "CELERY_TASK_TIME_LIMIT='ten' is not an integer"),
        ({"VOLT_ENCRYPTION_KEY": "short"}, "VOLT_ENCRYPTION_KEY must be a Fernet key"),
        ({"DEBUG": "0", "ALLOWED_HOSTS": "x"}, "SECRET_KEY must be set"),
        ({"CELERY_TASK_SOFT_TIME_LIMIT": "400", "CELERY_TASK_TIME_LIMIT": "300"}, "must be larger than"),
        # Redis would hand a runtime install (hard limit 1960 s) to a second worker while the first runs it.
        (
            {"CELERY_VISIBILITY_TIMEOUT": "1700"},
            "CELERY_VISIBILITY_TIMEOUT=1700 is below the minimum of 2000",
        ),
        ({"VOLT_INSTALL_ID": "Prod_7!"}, "VOLT_INSTALL_ID must be 1-12 lower-case letters or digits"),
        (
            {"VOLT_STORE_ENDPOINT": "http://127.0.0.1:9", "VOLT_STORE_ACCESS_KEY": ""},
            "VOLT_STORE_ENDPOINT is set: set VOLT_STORE_ACCESS_KEY and VOLT_STORE_SECRET_KEY too",
        ),
    ],
)
def test_invalid_settings_fail_at_start_with_a_clear_message(env, message):
    result = manage("check", env=env)
    assert result.returncode != 0
    assert message in result.stderr


def test_deploy_check_is_clean_with_production_settings():
    result = manage("check", "--deploy", "--fail-level", "WARNING", env=PRODUCTION)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


@pytest.mark.parametrize(
    ("variable", "url", "check"),
    [
        ("REDIS_URL", "redis://redis.internal:6379/0", "volt.W001"),
        ("DATABASE_URL", "postgres://volt@db.internal:5432/volt", "volt.W002"),
    ],
)
def test_deploy_check_wants_a_password_on_redis_and_postgresql(variable, url, check):
    """Jobs are hostile code: a Redis or PostgreSQL that trusts whoever connects is one firewall away."""
    result = manage("check", "--deploy", "--fail-level", "WARNING", env={**PRODUCTION, variable: url})
    assert result.returncode != 0
    assert check in result.stderr and "has no password" in result.stderr


def test_openapi_schema_generates_without_warnings(tmp_path):
    out = tmp_path / "schema.yaml"
    result = manage("spectacular", "--fail-on-warn", "--validate", "--file", str(out))
    assert result.returncode == 0, result.stderr
    schema = out.read_text()
    for path in (
        "/api/v1/hosts/",
        "/api/v1/offers/",
        "/api/v1/gpus/",
        "/api/v1/providers/",
        "/api/v1/tokens/",
    ):
        assert path in schema


@pytest.mark.django_db
def test_schema_and_docs_pages_are_served(client, alice):
    client.force_login(alice)
    assert client.get("/api/schema/").status_code == 200
    docs = client.get("/api/docs/")
    assert docs.status_code == 200 and b"cdn" not in docs.content.lower()


def test_debug_is_off_unless_set_so_the_source_secret_is_refused(tmp_path):
    """Issue 9.6: with DEBUG unset, Volt used to run in debug mode with the dev SECRET_KEY."""
    result = manage(
        "check", env={"DJANGO_SETTINGS_MODULE": "voltweb.settings", "VOLT_DATA_DIR": str(tmp_path)}
    )

    assert result.returncode != 0
    assert "SECRET_KEY must be set" in result.stderr


def test_the_demo_turns_debug_on_for_itself_with_secrets_of_its_own(tmp_path):
    unset = {"VOLT_ALLOW_LOCAL_HOSTS", "VOLT_LOCAL_HOSTS_FOR_PROVIDERS", "VOLT_ENCRYPTION_KEY"}
    clean = {k: v for k, v in os.environ.items() if k not in PRODUCTION and k not in unset}

    result = subprocess.run(
        [sys.executable, "manage.py", "demo", "--help"],
        cwd=ROOT,
        env={**clean, "DJANGO_SETTINGS_MODULE": "voltweb.settings", "VOLT_DATA_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 0, result.stderr
    secrets_file = tmp_path / "demo-secrets.json"
    assert secrets_file.stat().st_mode & 0o777 == 0o600


def test_demo_secrets_are_generated_once_and_reused(tmp_path):
    from voltweb.demo_env import prepare_demo_environment

    first: dict[str, str] = {"VOLT_DATA_DIR": str(tmp_path)}
    second: dict[str, str] = {"VOLT_DATA_DIR": str(tmp_path)}
    chosen: dict[str, str] = {"VOLT_DATA_DIR": str(tmp_path), "SECRET_KEY": "an operator's own", "DEBUG": "0"}
    path = prepare_demo_environment(first)
    prepare_demo_environment(second)
    prepare_demo_environment(chosen)

    assert first["DEBUG"] == "1" and first["VOLT_ALLOW_LOCAL_HOSTS"] == "1"
    assert len(first["SECRET_KEY"]) >= 50 and "insecure" not in first["SECRET_KEY"]
    assert second["SECRET_KEY"] == first["SECRET_KEY"]
    assert second["VOLT_ENCRYPTION_KEY"] == first["VOLT_ENCRYPTION_KEY"]
    assert chosen["SECRET_KEY"] == "an operator's own" and chosen["DEBUG"] == "0"
    assert path.stat().st_mode & 0o777 == 0o600
    other = tmp_path / "elsewhere"
    assert prepare_demo_environment({"VOLT_DATA_DIR": str(other)}) != path
    assert json.loads((other / "demo-secrets.json").read_text())["SECRET_KEY"] != first["SECRET_KEY"]
