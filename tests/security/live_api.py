"""A live Volt API server for black-box tests (schemathesis): its own database, seeded, on a free port.

The server is daphne (as in production) started as a subprocess against a database of its own — a SQLite
file in a temporary folder, or, when DATABASE_URL is PostgreSQL, a fresh database on that server dropped
at the end — so nothing the fuzzer creates reaches other tests. Celery tasks go to an in-memory broker
that nothing consumes: fuzzed SSH addresses are never contacted, and no worker of another run picks up
this server's tasks.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse, urlunparse

REPO_ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
START_TIMEOUT_S = 60


@dataclass
class LiveApi:
    url: str
    tokens: dict[str, str]  # username -> bearer token
    log: Path

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def _database(tmp: Path) -> Iterator[str]:
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://", "pgsql://")):
        yield f"sqlite:///{tmp / 'api.sqlite3'}"
        return
    import psycopg

    name = f"volt_live_api_{uuid.uuid4().hex[:8]}"
    admin = urlunparse(urlparse(url)._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunparse(urlparse(url)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _manage(env: dict, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode:
        raise AssertionError(f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


@contextmanager
def live_api(tmp: Path, users: tuple[str, ...]) -> Iterator[LiveApi]:
    """Migrate and seed (seed_demo) a database of its own, mint a token per user, serve it with daphne."""
    with _database(tmp) as database_url:
        env = os.environ | {
            "DATABASE_URL": database_url,
            "VOLT_DATA_DIR": str(tmp / "data"),
            "CELERY_BROKER_URL": "memory://",
            "VOLT_AUTO_PROVISION": "0",
            "DEBUG": "1",
            "VOLT_ALLOW_LOCAL_HOSTS": "1",
            # No link shaping: seed_demo's hosts would keep the demo addresses shaped after the server
            # stops (its data dir outlives the test), and a later stack on them (the browser tests) was
            # refused as "shaped by another Volt install".
            "VOLT_LOCAL_FABRIC_EMULATION": "off",
        }
        _manage(env, "migrate", "-v0")
        _manage(env, "seed_demo")
        tokens = {
            user: _manage(env, "create_api_token", user, "--name", "live-api").strip() for user in users
        }
        port = free_port()
        log = tmp / "daphne.log"
        with log.open("wb") as out:
            server = subprocess.Popen(
                [str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(port), "voltweb.asgi:application"],
                cwd=REPO_ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        api = LiveApi(url=f"http://127.0.0.1:{port}", tokens=tokens, log=log)
        try:
            _wait_until_up(api, server)
            yield api
        finally:
            _stop(server)


def _wait_until_up(api: LiveApi, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"daphne exited with {server.returncode}:\n{api.log_tail()}")
        try:
            with urllib.request.urlopen(f"{api.url}/healthz", timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"daphne did not answer within {START_TIMEOUT_S} s:\n{api.log_tail()}")


def _stop(server: subprocess.Popen) -> None:
    """SIGTERM the server's process group (its own session), SIGKILL after a grace."""
    for signum, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(server.pid, signum)
        except ProcessLookupError:
            return
        try:
            server.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
