"""Browser tests drive Debian's Chromium (Playwright) against the real stack: daphne + a Celery worker.

`live_stack` (session scope) runs, against pytest-django's test database:

    daphne -b 127.0.0.1 -p <free port> voltweb.asgi:application     web pages, htmx, websockets
    celery -A voltweb worker -Q placement,provisioning,monitoring,jobs -P solo -n volt-browser-<pid>@%h

Both get DATABASE_URL pointing at the *test* database (SQLite: a file in a temporary folder, since an
in-memory database cannot be shared between processes), VOLT_DATA_DIR = a temporary folder shared with
this process (the `local` driver's host sandboxes live there), and REDIS_URL = the configured Redis
server with a database index of its own (VOLT_BROWSER_REDIS_DB, default 15), flushed at start: a demo
worker or another test run on the same server cannot take our onboarding tasks, and our websocket
groups cannot mix with theirs. The demo data (seed_demo: users, two providers, 11 local hosts) is
committed once, before the browser starts. Both servers are stopped by process group at teardown.

Sync Playwright keeps an asyncio loop running in this thread, where Django refuses ORM calls; use the
`orm` fixture, which runs a function in a helper thread.

A missing Chromium fails the run (never skips): install Debian's chromium (apt-get install -y chromium).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlparse, urlunparse

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO_ROOT / "var" / "screenshots"
QUEUES = ("placement", "provisioning", "monitoring", "jobs")
BROWSER_ARGS = (
    "--headless --no-sandbox --disable-gpu --disable-quic --no-first-run"
    " --disable-background-networking --disable-component-update --disable-sync"
).split()
DEMO_PASSWORD = "volt-demo"
START_TIMEOUT_S = 60


# --- the test database: one every process can open --------------------------------------------------


@pytest.fixture(scope="session")
def django_db_modify_db_settings(
    request, django_db_modify_db_settings_parallel_suffix, tmp_path_factory
) -> None:
    """SQLite: a file test database (servers open it too). PostgreSQL: a name of its own, so a unit-test
    run on the same server (which uses test_<NAME>) cannot drop the database under our servers."""
    from django.conf import settings

    if any(item.get_closest_marker("browser") is None for item in request.session.items):
        pytest.fail(
            "Run browser tests in a pytest process of their own: pytest -m browser tests/browser",
            pytrace=False,
        )

    db = settings.DATABASES["default"]
    test = db.setdefault("TEST", {})
    if db["ENGINE"].endswith("sqlite3"):
        test["NAME"] = str(tmp_path_factory.mktemp("browser-db") / "volt-browser.sqlite3")
    elif not test.get("NAME"):
        test["NAME"] = f"test_{db['NAME']}_browser"


@pytest.fixture(scope="session")
def django_db_setup(
    request, django_test_environment, django_db_blocker, django_db_modify_db_settings
) -> Iterator[None]:
    """Create the test database for the servers, whatever the tests are marked with.

    pytest-django creates test databases only for tests that use a `django_db` mark or the `db` fixtures,
    whose per-test rollback or flush would undo the session's seed. Browser tests use neither: their data
    is committed once by live_stack and the database is dropped at the end of the run.
    """
    from django.test.utils import setup_databases, teardown_databases

    verbosity = request.config.option.verbose
    with django_db_blocker.unblock():
        config = setup_databases(
            verbosity=verbosity, interactive=False, aliases={"default"}, serialized_aliases=set()
        )
    yield
    with django_db_blocker.unblock():
        teardown_databases(config, verbosity=verbosity)


def _database_url(settings_dict: dict) -> str:
    """A DATABASE_URL for the (already created) test database described by `settings_dict`."""
    if settings_dict["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{settings_dict['NAME']}"
    user = quote(settings_dict.get("USER") or "", safe="")
    password = quote(settings_dict.get("PASSWORD") or "", safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = settings_dict.get("HOST") or "127.0.0.1"
    port = f":{settings_dict['PORT']}" if settings_dict.get("PORT") else ""
    return f"postgres://{auth}{host}{port}/{quote(settings_dict['NAME'], safe='')}"


def _isolated_redis_url(url: str) -> str:
    """The same Redis server, another database index (redis:// and rediss:// URLs; others are kept)."""
    parsed = urlparse(url)
    if parsed.scheme not in ("redis", "rediss"):
        return url
    return urlunparse(parsed._replace(path=f"/{os.environ.get('VOLT_BROWSER_REDIS_DB', '15')}"))


# --- the live stack -----------------------------------------------------------------------------------


@dataclass
class LiveStack:
    """The running servers: `url` is the console's base URL; `logs` name each server's output file."""

    url: str
    data_dir: Path
    redis_url: str
    worker_name: str
    logs: dict[str, Path]
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    settings: dict = field(default_factory=dict)  # what the servers run with that `orm` calls need too

    def pause_queue(self, queue: str) -> None:
        """Stop the worker taking tasks from `queue` (they wait in Redis) until resume_queue."""
        self._control("cancel_consumer", queue)

    def resume_queue(self, queue: str) -> None:
        self._control("add_consumer", queue)

    def _control(self, command: str, queue: str) -> None:
        from celery import Celery

        # An app of its own: this process's Celery app points at the configured Redis database, not ours.
        control = Celery("volt-browser-control", broker=self.redis_url)
        try:
            replies = getattr(control.control, command)(
                queue, destination=[self.worker_name], reply=True, timeout=10
            )
        finally:
            control.close()
        if not replies:
            raise AssertionError(
                f"worker {self.worker_name} did not answer {command}({queue})\n{self.log_tails()}"
            )

    def check_alive(self) -> None:
        dead = {name: p.returncode for name, p in self.processes.items() if p.poll() is not None}
        if dead:
            raise AssertionError(f"server(s) exited: {dead}\n{self.log_tails()}")

    def log_tails(self, chars: int = 4000) -> str:
        parts = []
        for name, path in self.logs.items():
            text = path.read_text(errors="replace") if path.exists() else ""
            parts.append(f"----- {name} ({path}), last {chars} chars -----\n{text[-chars:]}")
        return "\n".join(parts)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(name: str, cmd: list[str], env: dict[str, str], log_dir: Path, stack: LiveStack) -> None:
    log = log_dir / f"{name}.log"
    stack.logs[name] = log
    with log.open("wb") as out:
        stack.processes[name] = subprocess.Popen(
            cmd, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _stop(processes: dict[str, subprocess.Popen]) -> None:
    """SIGTERM each server's process group (it was started in a session of its own), then SIGKILL."""
    for proc in processes.values():
        _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + 10
    for proc in processes.values():
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()


def _signal_group(proc: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(proc.pid, signum)
    except ProcessLookupError:
        pass  # already gone with its group


def _wait_until_ready(stack: LiveStack) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    web_up = worker_up = False
    while time.monotonic() < deadline and not (web_up and worker_up):
        stack.check_alive()
        if not web_up:
            try:
                with urllib.request.urlopen(f"{stack.url}/healthz", timeout=2) as response:
                    web_up = response.status == 200
            except OSError:
                pass
        if not worker_up:
            worker_up = re.search(rb"\bready\.", stack.logs["worker"].read_bytes()) is not None
        time.sleep(0.2)
    if not (web_up and worker_up):
        raise AssertionError(
            f"servers not ready within {START_TIMEOUT_S} s (web: {web_up}, worker: {worker_up})\n{stack.log_tails()}"
        )


@pytest.fixture(scope="session")
def live_stack(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[LiveStack]:
    """daphne + Celery worker on the test database, seeded with the demo inventory (see module doc)."""
    import redis
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection

    data_dir = tmp_path_factory.mktemp("volt-data")
    log_dir = tmp_path_factory.mktemp("volt-logs")
    saved_data_dir = settings.VOLT_DATA_DIR
    settings.VOLT_DATA_DIR = data_dir  # seed_demo below lays out host sandboxes here, as the worker will
    redis_url = _isolated_redis_url(settings.REDIS_URL)
    if redis_url != settings.REDIS_URL:
        redis.Redis.from_url(redis_url).flushdb()  # our own database index: stale tasks, channel groups

    with django_db_blocker.unblock():
        if connection.settings_dict["NAME"] != connection.settings_dict["TEST"]["NAME"]:
            pytest.fail(
                f"refusing to seed {connection.settings_dict['NAME']}: not the test database", pytrace=False
            )
        database_url = _database_url(connection.settings_dict)
    port = _free_port()
    worker_name = f"volt-browser-{os.getpid()}@{socket.gethostname()}"
    stack = LiveStack(f"http://127.0.0.1:{port}", data_dir, redis_url, worker_name, logs={})
    stack.settings = {
        "VOLT_DATA_DIR": data_dir,
        "VOLT_LOCAL_FABRIC_EMULATION": settings.VOLT_LOCAL_FABRIC_EMULATION,
        "VOLT_AUTO_RECOVER": False,
    }
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "voltweb.settings",
        "DEBUG": "1",
        # As the demo (voltweb/demo_env.py): provider admins may add local hosts.
        "VOLT_ALLOW_LOCAL_HOSTS": "1",
        "VOLT_LOCAL_HOSTS_FOR_PROVIDERS": "1",
        "PYTHONUNBUFFERED": "1",
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "CELERY_BROKER_URL": redis_url,
        "CELERY_TASK_ALWAYS_EAGER": "0",
        "VOLT_DATA_DIR": str(data_dir),
        # The live page's test kills a node to see the watch's DEGRADED arrive; automatic recovery (its own
        # integration tests) would move on to RECOVERING and cordon the host the later tests list.
        "VOLT_AUTO_RECOVER": "0",
        # Links shaped where this process may (root: CI), as the demo does; the live page's link_degraded
        # drill needs them. Elsewhere plain loopback, and the pages show the "not emulated" note.
        "VOLT_LOCAL_FABRIC_EMULATION": settings.VOLT_LOCAL_FABRIC_EMULATION,
    }
    python = sys.executable
    try:
        # Start both servers first: their start-up overlaps with seeding (~10 s of real discovery).
        web = f"-m daphne -b 127.0.0.1 -p {port} voltweb.asgi:application"
        worker = (
            f"-m celery -A voltweb worker -Q {','.join(QUEUES)} -c 1 -P solo -n {worker_name}"
            " --without-gossip --without-mingle --without-heartbeat --loglevel INFO"
        )
        _start("web", [python, *web.split()], env, log_dir, stack)
        _start("worker", [python, *worker.split()], env, log_dir, stack)
        with django_db_blocker.unblock():
            with open(os.devnull, "w") as quiet:
                call_command("seed_demo", stdout=quiet)
            connection.close()
        _wait_until_ready(stack)
        yield stack
    finally:
        _stop(stack.processes)
        leftovers = _kill_leftovers(data_dir)
        _unshape(data_dir)
        settings.VOLT_DATA_DIR = saved_data_dir
    assert not leftovers, f"the browser tests left processes of the stack's clusters running: {leftovers}"


def _kill_leftovers(data_dir: Path) -> dict[int, str]:
    """Kill what still runs of the stack once its servers are stopped (Ray nodes of a cluster a test did
    not terminate, a probe rank) and say what it was: the tests end every cluster they start."""
    from tests.integration.test_demo import processes_of

    left = processes_of(data_dir)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def _unshape(data_dir: Path) -> None:
    """Remove the stack's shaped links: left on `lo`, their filters would outrank the next run's."""
    from inventory import fabric_emulation as fe

    for pid_file in data_dir.glob("hosts/*/faults/.link_flapping.pid"):
        fe.stop_flapping(pid_file.with_name("link_flapping"))
    try:
        fe.remove(data_dir)
    except fe.EmulationUnavailable as exc:
        print(f"could not remove the stack's shaped links: {exc}", file=sys.stderr)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed browser test carries the servers' last log lines in its report."""
    report = yield
    stack = item.funcargs.get("live_stack") if hasattr(item, "funcargs") else None
    if report.failed and isinstance(stack, LiveStack):
        report.sections.append(("live stack logs", stack.log_tails()))
    return report


# --- the ORM from a test (Playwright's loop runs in this thread) ------------------------------------


@pytest.fixture(scope="session")
def orm(live_stack, django_db_blocker) -> Callable:
    """`orm(fn, *args)` runs fn in a helper thread with database access and the stack's settings, and
    returns its result."""
    from django.db import connection
    from django.test import override_settings

    def call(fn: Callable, *args, **kwargs):
        def run():
            try:
                # The stack's data dir (host sandboxes, the install's Ray marker), not the test's own
                # folder: a cluster terminated from here must find its Ray nodes to stop them.
                with override_settings(**live_stack.settings):
                    return fn(*args, **kwargs)
            finally:
                connection.close()

        with django_db_blocker.unblock(), ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(run).result()

    return call


# --- Chromium ---------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def chromium_executable() -> str:
    """VOLT_BROWSER or Debian's /usr/bin/chromium; missing fails the run (Playwright never downloads one)."""
    executable = os.environ.get("VOLT_BROWSER", "/usr/bin/chromium")
    if not os.access(executable, os.X_OK):
        pytest.fail(
            f"No Chromium at {executable}: install Debian's chromium: apt-get install -y chromium",
            pytrace=False,
        )
    return executable


@pytest.fixture(scope="session")
def browser(chromium_executable, live_stack):
    """Debian's Chromium, headless. Depends on live_stack so seeding runs before Playwright's loop exists."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium_executable, headless=True, args=BROWSER_ARGS
        )
        yield browser
        browser.close()


@pytest.fixture
def page(browser, live_stack):
    """A fresh browser context (no cookies) per test; the console's base URL is the default."""
    context = browser.new_context(base_url=live_stack.url, viewport={"width": 1280, "height": 900})
    context.set_default_timeout(10_000)
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture
def login(page):
    """`login(username)` signs in through the login form and returns the page."""
    from playwright.sync_api import expect

    def sign_in(username: str, password: str = DEMO_PASSWORD):
        page.goto("/login/")
        page.fill("#id_username", username)
        page.fill("#id_password", password)
        page.click("button[type=submit]")
        if password == DEMO_PASSWORD:
            expect(page.locator(".topbar .who")).to_contain_text(username)
        return page

    return sign_in


@pytest.fixture(scope="session")
def screenshot() -> Callable:
    """`screenshot(page, name)` writes var/screenshots/<name>.png (full page)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def take(page, name: str) -> Path:
        path = SCREENSHOTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take
