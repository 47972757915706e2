"""Run the whole embedded demo: migrate, seed, Redis, web server, Celery worker and beat."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

from voltweb import embedded_redis


class Command(BaseCommand):
    help = "Start Volt's demo: web console on http://127.0.0.1:PORT/ with a Celery worker, beat and Redis."

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--no-seed", action="store_true", help="Skip seeding demo users and hosts.")
        parser.add_argument("--exit-after", type=float, default=0, help="Stop after N seconds (smoke tests).")

    def handle(self, port, no_seed, exit_after, **options):
        call_command("migrate", interactive=False, verbosity=0)
        if not no_seed:
            call_command("seed_demo")
        from inventory import services as inventory

        inventory.sync_local_fabric()  # local links shaped while the demo runs (root), or a note why not
        self.stdout.write(f"Local links: {inventory.unavailable_reason() or 'emulated (shaped on lo)'}.")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        children: list[subprocess.Popen] = []
        redis_url = settings.REDIS_URL
        if not embedded_redis.answers(redis_url):
            redis_url, proc = embedded_redis.start_embedded(data_dir=settings.VOLT_DATA_DIR / "redis")
            children.append(proc)
            self.stdout.write(f"No Redis at {settings.REDIS_URL}; started an embedded one at {redis_url}.")
        env["REDIS_URL"] = redis_url

        python = sys.executable
        queues = ",".join(settings.VOLT_QUEUES)
        commands = {
            "web": [python, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "voltweb.asgi:application"],
            "worker": [
                python,
                "-m",
                "celery",
                "-A",
                "voltweb",
                "worker",
                "-Q",
                queues,
                "-c",
                "2",
                "--loglevel",
                "INFO",
                "-n",
                f"demo-{os.getpid()}@%h",
            ],
            "beat": [
                python,
                "-m",
                "celery",
                "-A",
                "voltweb",
                "beat",
                "--loglevel",
                "INFO",
                "-s",
                str(settings.VOLT_DATA_DIR / "celerybeat-schedule"),
            ],
        }
        try:
            for cmd in commands.values():
                children.append(subprocess.Popen(cmd, env=env, start_new_session=True))
            self._wait_for_web(port, children)
            self._announce(port)
            self._supervise(children, exit_after)
        finally:
            self._stop(children)
            inventory.remove_local_fabric()  # lo as it was: nothing of this demo stays shaped

    def _wait_for_web(self, port: int, children) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            if any(c.poll() is not None for c in children):
                raise SystemExit("A demo process exited during start-up; see its output above.")
            time.sleep(0.5)
        raise SystemExit(f"The web server did not answer on port {port} within 60 s.")

    def _announce(self, port: int) -> None:
        from inventory.management.commands.seed_demo import DEMO_PASSWORD, USERS

        self.stdout.write(self.style.SUCCESS(f"\nVolt is running: http://127.0.0.1:{port}/"))
        self.stdout.write(f"Sign in with password {DEMO_PASSWORD!r} as:")
        roles = {
            "admin": "platform admin",
            "alice": "researcher, Demo Lab",
            "tom": "team admin, Demo Lab",
            "bob": "researcher, Other Lab",
            "priya": "provider admin, Northwind GPU Cloud",
            "omar": "provider admin, Helios Compute",
        }
        for user in USERS:
            self.stdout.write(f"  {user:<6} {roles.get(user, '')}")
        self.stdout.write("API docs: /api/docs/   Stop: Ctrl-C\n")

    def _supervise(self, children, exit_after: float) -> None:
        stop = {"now": False}

        def request_stop(signum, frame):
            stop["now"] = True

        signal.signal(signal.SIGINT, request_stop)
        signal.signal(signal.SIGTERM, request_stop)
        started = time.monotonic()
        while not stop["now"]:
            if exit_after and time.monotonic() - started > exit_after:
                return
            dead = [c for c in children if c.poll() is not None]
            if dead:
                self.stderr.write(
                    f"A demo process ({' '.join(map(str, dead[0].args[:4]))}) exited; stopping."
                )
                return
            time.sleep(0.5)

    def _stop(self, children) -> None:
        for child in children:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for child in children:
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
        self.stdout.write("Demo stopped.")
