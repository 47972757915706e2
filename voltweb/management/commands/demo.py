"""Run the whole embedded demo: migrate, seed, Redis, the checkpoint store, web server, Celery worker and beat.

The terminal shows what a person needs: start-up, the banner (with the log file's path), a line per
cluster state change, errors, and the stop. Everything the web server, the workers and beat print goes
to the log file, `VOLT_DATA_DIR/demo.log` (the previous run's kept as demo.log.1): one INFO line per
periodic task scrolled the banner away within seconds (issue 24).
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import UTC
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from inventory.lab.machines import SHARED_MOUNT as LAB_SHARED_DIR
from voltweb import embedded_redis, embedded_store, namespace


class Command(BaseCommand):
    help = "Start Volt's demo: web console on http://127.0.0.1:PORT/ with a Celery worker, beat and Redis."

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.terminal = threading.Lock()
        self.log = None  # the demo's log file, opened by handle(); the banner can be shown without one

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--no-seed", action="store_true", help="Skip seeding demo users and hosts.")
        parser.add_argument("--exit-after", type=float, default=0, help="Stop after N seconds (smoke tests).")
        parser.add_argument(
            "--lab", action="store_true",
            help="Root: run the demo's hosts as lab machines (manage.py lab; lab $VOLT_LAB, default 1), "
            "onboarded over SSH, instead of local hosts. The lab goes down when the demo stops.",
        )  # fmt: skip

    def handle(self, port, no_seed, exit_after, lab=False, **options):
        _check_port_free(port)
        self.lab = int(os.environ.get("VOLT_LAB", "1")) if lab else 0
        if self.lab and os.geteuid() != 0:
            raise CommandError("--lab makes network, mount and PID namespaces: run the demo as root (sudo).")
        if self.lab:  # the lab's shared folder stands in for shared storage (checkpoints) on its machines
            os.environ["VOLT_SSH_SHARED_DIR"] = settings.VOLT_SSH_SHARED_DIR = LAB_SHARED_DIR
        self.log = _open_log(settings.VOLT_DATA_DIR)
        self.tails: dict[str, collections.deque] = {}
        _log_this_process_to(self.log)
        children: list[subprocess.Popen] = []
        redis: list[subprocess.Popen] = []  # stopped last: stopping clusters still broadcasts through it
        self.store = (
            None  # the embedded checkpoint store: stopped after the clusters (they revoke their keys)
        )
        try:
            self._run(port, no_seed, exit_after, children, redis)
        finally:
            self._stop(children)  # web, worker and beat first: nothing starts a Ray node after this
            self._stop_clusters()
            if self.store is not None:
                embedded_store.stop(self.store.pid, self.store.data_dir)
            self._stop(redis)
            _remove_local_fabric()  # lo as it was: nothing of this demo stays shaped
            if self.lab:
                self._say(f"Taking lab {self.lab} down ...")
                call_command("lab", "down", "--lab", str(self.lab))
            self._say("Demo stopped.")
            self.log.close()

    def _start_store(self) -> None:
        """An embedded SeaweedFS for the demo's checkpoints (VOLT_STORE_* unset), afresh in the data dir: the
        clusters that wrote to the last one were terminated with it."""
        folder = Path(settings.VOLT_DATA_DIR) / "store"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        try:
            self.store = embedded_store.start(folder)
        except embedded_store.StoreError as exc:
            self._say(f"No checkpoint store ({exc}): checkpoints stay on the clusters' shared storage.")
            return
        values = {"VOLT_STORE_ENDPOINT": self.store.endpoint, "VOLT_STORE_ACCESS_KEY": self.store.access_key,
                  "VOLT_STORE_SECRET_KEY": self.store.secret_key,
                  "VOLT_STORE_PRIVATE_PORTS": ",".join(map(str, self.store.private_ports))}  # fmt: skip
        for name, value in values.items():  # the web server and the workers inherit them
            os.environ[name] = value
            setattr(settings, name, value.split(",") if name == "VOLT_STORE_PRIVATE_PORTS" else value)
        self._say(f"Checkpoints go to an embedded S3 store (SeaweedFS) at {self.store.endpoint}.")

    def _say(self, text: str, style=None) -> None:
        """A line on the terminal (and in the log), whole even while children's errors are echoed."""
        with self.terminal:
            self.stdout.write(style(text) if style else text)
            if self.log is not None:
                self.log.write(f"demo | {text.strip()}\n")
                self.log.flush()

    def _run(self, port, no_seed, exit_after, children, redis) -> None:
        redis_url = settings.REDIS_URL
        if not embedded_redis.answers(redis_url):
            # A port of its own (not the fixed default): a second install's demo must not share it.
            redis_url, proc = embedded_redis.start_embedded(
                port=_free_port(), data_dir=settings.VOLT_DATA_DIR / "redis"
            )
            redis.append(proc)
            self._say(f"No Redis at {settings.REDIS_URL}; started an embedded one at {redis_url}.")
            _use_redis(redis_url)  # before seeding: it writes the cache and broadcasts
        if not settings.VOLT_STORE_ENDPOINT:
            self._start_store()
        call_command("migrate", interactive=False, verbosity=0)
        if os.geteuid() == 0:  # clusters run Ray as users of their own, from a runtime they can run
            try:
                # A runtime of an older Volt (other pins, e.g. no numpy) would refuse every local cluster.
                call_command("local_runtime", rebuild=True)
            except CommandError as exc:
                self._say(f"No local Ray runtime ({exc}): local clusters' jobs are not isolated.")
        if self.lab:
            self._say(f"Bringing lab {self.lab} up (8 machines apart on this box; about a minute) ...")
            call_command("lab", "up", "--lab", str(self.lab))
            from inventory.lab import operations as lab_operations

            reached = lab_operations.status(Path(settings.VOLT_LAB_DIR), self.lab).store_endpoint
            if reached:  # the lab's machines reach the store through its gate: checkpoints go there too
                os.environ["VOLT_STORE_NODE_ENDPOINT"] = settings.VOLT_STORE_NODE_ENDPOINT = reached
            if not no_seed:  # onboarding and runtime installs are queued: the worker runs them
                call_command("seed_demo", lab=self.lab)
        elif not no_seed:
            call_command("seed_demo")
        from inventory import services as inventory

        inventory.sync_local_fabric()  # local links shaped while the demo runs (root), or a note why not
        self._say(f"Local links: {inventory.unavailable_reason() or 'emulated (shaped on lo)'}.")
        # The web port is one of Volt's own: cluster users may not open it (clusters/provisioning/node_firewall.py).
        service_ports = ",".join(str(p) for p in sorted({*settings.VOLT_SERVICE_PORTS, port}))
        env = dict(os.environ, PYTHONUNBUFFERED="1", REDIS_URL=redis_url, VOLT_SERVICE_PORTS=service_ports)

        python = sys.executable
        # Jobs get a worker of their own: a probe or a provisioning (minutes) must not hold up a job's
        # submission, polls and logs (seconds).
        queues = ",".join(q for q in settings.VOLT_QUEUES if q != "jobs")

        def celery_worker(queues: str, name: str) -> list[str]:
            return [python, "-m", "celery", "-A", "voltweb", "worker", "-Q", queues, "-c", "2",
                    "--loglevel", "INFO", "-n", name]  # fmt: skip

        commands = {
            "web": [python, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "voltweb.asgi:application"],
            "worker": celery_worker(queues, f"demo-{os.getpid()}@%h"),
            "jobs-worker": celery_worker("jobs", f"demo-jobs-{os.getpid()}@%h"),
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
        for name, cmd in commands.items():
            child = subprocess.Popen(
                cmd, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
            child.volt_name = name
            children.append(child)
            threading.Thread(target=self._follow, args=(name, child), daemon=True).start()
        self._wait_for_web(port, children)
        self._announce(port)
        self._supervise(children + redis, exit_after)

    def _follow(self, name: str, child: subprocess.Popen) -> None:
        """Every line of a child into the log file; its errors on the terminal too."""
        tail = self.tails.setdefault(name, collections.deque(maxlen=30))
        for raw in child.stdout:
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            tail.append(line)
            with self.terminal:
                self.log.write(f"{name} | {line}\n")
                self.log.flush()
                if _is_error(line):
                    self.stderr.write(f"{name}: {line[:500]}")

    def _last_lines(self, child: subprocess.Popen) -> str:
        name = getattr(child, "volt_name", "")
        time.sleep(0.5)  # its last lines reach the reader thread
        lines = list(self.tails.get(name, ()))[-15:]
        return "\n".join(f"  {name}: {line}" for line in lines)

    def _wait_for_web(self, port: int, children) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            dead = [c for c in children if c.poll() is not None]
            if dead:
                raise SystemExit(
                    f"A demo process ({getattr(dead[0], 'volt_name', '')}) exited during start-up; its last "
                    f"lines:\n{self._last_lines(dead[0])}\nThe whole output: {self.log.name}"
                )
            time.sleep(0.5)
        raise SystemExit(f"The web server did not answer on port {port} within 60 s.")

    def _announce(self, port: int) -> None:
        from inventory.management.commands.seed_demo import DEMO_PASSWORD, USERS

        self._say(f"\nVolt is running: http://127.0.0.1:{port}/", self.style.SUCCESS)
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
        from inventory import services as inventory

        cordoned = inventory.cordoned_hosts_line()
        if cordoned:  # out of service since the last run: uncordon them on their host pages
            self.stdout.write(self.style.WARNING(cordoned))
        if self.log is not None:
            self.stdout.write(f"Log of the web server, workers and beat: {self.log.name}")
        self.stdout.write("API docs: /api/docs/   Stop: Ctrl-C\n")

    def _supervise(self, children, exit_after: float) -> None:
        stop = {"now": False}

        def request_stop(signum, frame):
            stop["now"] = True

        signal.signal(signal.SIGINT, request_stop)
        signal.signal(signal.SIGTERM, request_stop)
        started = time.monotonic()
        seen = _last_event_ids()
        while not stop["now"]:
            if exit_after and time.monotonic() - started > exit_after:
                return
            dead = [c for c in children if c.poll() is not None]
            if dead:
                self.stderr.write(
                    f"A demo process ({' '.join(map(str, dead[0].args[:4]))}) exited; stopping. Its last "
                    f"lines:\n{self._last_lines(dead[0])}\nThe whole output: {self.log.name}"
                )
                return
            seen = self._cluster_changes(seen)
            time.sleep(0.5)

    def _cluster_changes(self, seen: tuple[int, int]) -> tuple[int, int]:
        """One terminal line per cluster state change, and per job that ended, was interrupted or was
        resubmitted, since events `seen` (cluster, job); returns the last ones' ids. A note that changes
        no state ("recovering → recovering") stays in the log file."""
        from clusters.models import ClusterEvent
        from jobs.models import JobEvent

        cluster_seen, job_seen = seen
        try:
            events = list(
                ClusterEvent.objects.filter(pk__gt=cluster_seen)
                .exclude(to_status="")
                .select_related("cluster")
                .order_by("pk")[:50]
            )
            job_events = list(
                JobEvent.objects.filter(pk__gt=job_seen)
                .exclude(to_status="")
                .select_related("job")
                .order_by("pk")[:50]
            )
        except DatabaseError as exc:  # busy for longer than the timeout: the next round catches up
            self.log.write(f"demo | reading cluster and job events: {exc}\n")
            return seen
        lines = []
        for event in events:
            if event.from_status == event.to_status:
                continue
            change = f"{event.from_status or 'new'} → {event.to_status}: {_first_line(event.message)}"
            lines.append((event.at, f"cluster {event.cluster_id} ({event.cluster.name}): {change}"))
        for event in job_events:
            if event.from_status == event.to_status or event.to_status not in _JOB_STATES_TO_SAY:
                continue
            change = f"{event.from_status or 'new'} → {event.to_status}: {_first_line(event.message)}"
            lines.append(
                (
                    event.at,
                    f"job {event.job_id} ({event.job.name}) on cluster {event.job.cluster_id}: {change}",
                )
            )
        for at, line in sorted(lines, key=lambda pair: pair[0]):
            self._say(f"{at.astimezone(UTC).strftime('%H:%M:%S')} UTC {line}")  # as the console shows times
        return (events[-1].pk if events else cluster_seen, job_events[-1].pk if job_events else job_seen)

    def _stop(self, children) -> None:
        for child in children:
            if child.poll() is None:
                # The main process only: Celery's warm shutdown lets its pool finish the task at hand
                # (a group-wide SIGTERM killed the pool mid-task: WorkerLostError). SIGKILL below
                # takes the whole group if it is not done in time.
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for child in children:
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:  # whatever of its group is still there (all of it, if it did not stop in time)
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            child.wait()

    def _stop_clusters(self) -> None:
        """Terminate every cluster its worker brought up: their Ray nodes outlive the worker otherwise."""
        from clusters import shutdown

        try:
            stopped = shutdown.stop_all_clusters("the demo was stopped (Ctrl-C): terminating its clusters")
        except DatabaseError as exc:  # e.g. stopped before its first migration
            self.stderr.write(f"Could not read the clusters to stop: {exc}")
            stopped = []
        leftovers = shutdown.kill_leftover_nodes()
        if stopped:
            self._say(f"Terminated {len(stopped)} cluster(s): {', '.join(stopped)}.")
        if leftovers:
            self._say(f"Killed {len(leftovers)} leftover Ray process(es).")


def _first_line(message: str, limit: int = 200) -> str:
    """A reason's first line (a failed job's carries the log's last lines below it), at most `limit` long."""
    line = (message or "").strip().split("\n", 1)[0].strip()
    return line if len(line) <= limit else line[: limit - 1] + "…"


# A job's changes the terminal names (the rest, e.g. pending → running, stay in the log file and on its page).
_JOB_STATES_TO_SAY = frozenset({"succeeded", "failed", "stopped", "interrupted", "pending"})

# Log lines a person must see on the terminal: a level of ERROR or CRITICAL, in the formats of Django's
# LOGGING ("... ERROR name: ..."), Celery ("[...: ERROR/ForkPoolWorker-1] ...") and daphne ("... ERROR ...").
_ERROR = re.compile(r"(?:^|[\s\[:])(?:ERROR|CRITICAL)[\s/:\]]")


def _is_error(line: str) -> bool:
    return bool(_ERROR.search(line[:200]))


def _open_log(data_dir: Path):
    """This run's log file (private: it holds hosts' addresses and tokens' prefixes); the last run's kept."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / "demo.log"
    if path.exists():
        path.replace(data_dir / "demo.log.1")
    return open(path, "a", encoding="utf-8", opener=lambda name, flags: os.open(name, flags, 0o600))


def _log_this_process_to(log) -> None:
    """The demo process's own log records go to the log file; the terminal keeps warnings and worse."""
    handler = logging.StreamHandler(log)
    handler.setFormatter(logging.Formatter("demo | %(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for existing in root.handlers:
        existing.setLevel(max(existing.level, logging.WARNING))
    root.addHandler(handler)
    # A line per SSH connection and channel (stopping clusters on SSH hosts, --lab): not the terminal's.
    logging.getLogger("asyncssh").setLevel(logging.WARNING)


def _last_event_ids() -> tuple[int, int]:
    """The newest cluster and job events' ids: the terminal reports what happens from now on."""
    from clusters.models import ClusterEvent
    from jobs.models import JobEvent

    try:
        return (
            ClusterEvent.objects.order_by("-pk").values_list("pk", flat=True).first() or 0,
            JobEvent.objects.order_by("-pk").values_list("pk", flat=True).first() or 0,
        )
    except DatabaseError:
        return (0, 0)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _use_redis(url: str) -> None:
    """Point this process's cache, channel layer and Celery producer at `url`.

    Settings were read before the embedded Redis existed; the system checks may already have built the
    cache object, so it is dropped and built again from the changed settings on next use.
    """
    from channels.layers import channel_layers
    from django.core.cache import caches

    from voltweb.celery import app as celery_app

    os.environ["REDIS_URL"] = url
    settings.REDIS_URL = settings.CELERY_BROKER_URL = url
    settings.CACHES["default"]["LOCATION"] = url
    settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"] = [url]
    settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"] = namespace.channel_prefix(url)
    celery_app.conf.broker_url = url
    try:
        del caches["default"]
    except AttributeError:  # not built yet
        pass
    channel_layers.backends.clear()


def _remove_local_fabric() -> None:
    from inventory import services as inventory

    inventory.remove_local_fabric()


def _check_port_free(port: int) -> None:
    """Fail at once, before anything starts, when another server holds the port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As servers bind: a closing connection's TIME_WAIT does not count, a listener does.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise CommandError(f"Cannot use port {port}: {exc.strerror}.") from None
            raise CommandError(
                f"Port {port} on 127.0.0.1 is already in use (another Volt demo or server?). "
                f"Stop it, or pick another port: scripts/demo --port {port + 1}"
            ) from None
