"""Test helpers for the cluster watch: a real Celery worker + beat, and a websocket listener thread."""

from __future__ import annotations

import asyncio
import threading
import time
from contextlib import contextmanager

from celery.beat import EmbeddedService
from celery.contrib.testing.worker import start_worker
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.conf import settings

from voltweb.celery import app as celery_app
from voltweb.periodic import SCHEDULE
from voltweb.routing import websocket_urlpatterns


@contextmanager
def worker_and_beat(
    tmp_path, interval_s: float, entries: tuple[str, ...] = ("watch-clusters",), also: dict | None = None
):
    """A real worker thread on every queue (fed by Redis) and a real beat running `entries` of the schedule
    (voltweb/periodic.py; by default the cluster watch) every `interval_s`, and those named in `also`
    ({name: seconds}) each at its own interval."""
    with celery_app.connection_for_write() as conn:
        for queue in settings.VOLT_QUEUES:
            conn.default_channel.queue_purge(queue)
    saved = celery_app.conf.beat_schedule
    # Only the watch: the other periodic tasks (host health sweep, reapers) are not what is tested here.
    celery_app.conf.beat_schedule = {
        name: {
            **SCHEDULE[name],
            "schedule": every,
            "options": {**SCHEDULE[name]["options"], "expires": every},
        }
        for name, every in [*((n, interval_s) for n in entries), *(also or {}).items()]
    }
    beat = EmbeddedService(
        celery_app, thread=True, max_interval=0.5, schedule_filename=str(tmp_path / "beat-schedule")
    )
    with start_worker(
        celery_app,
        pool="solo",
        perform_ping_check=False,
        queues=list(settings.VOLT_QUEUES),
        shutdown_timeout=30,
    ):
        beat.start()
        try:
            yield
        finally:
            beat.stop()
            celery_app.conf.beat_schedule = saved


class Listener:
    """A websocket to one cluster, read on its own thread and event loop; every message is kept."""

    def __init__(self, user=None, cluster_id: int = 0, headers=None, query: str = "", path: str = ""):
        self.messages: list[dict] = []
        self.connected: bool | None = None
        self.close_code = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        path = (path or f"/ws/clusters/{cluster_id}/") + (f"?{query}" if query else "")
        self._args = (user, path, headers or [])
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()
        self._ready.wait(30)

    async def _run(self):
        user, path, headers = self._args
        comm = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path, headers=headers)
        if user is not None:
            comm.scope["user"] = user
        self.connected, self.close_code = await comm.connect(timeout=20)
        self._ready.set()
        if not self.connected:
            return
        while not self._stop.is_set():
            # A receive that times out cancels the application, so look before reading.
            if await comm.receive_nothing(timeout=0.2, interval=0.05):
                continue
            self.messages.append(await comm.receive_json_from(timeout=10))
        await comm.disconnect()

    def wait_for(self, predicate, timeout_s: float = 20.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = next((m for m in list(self.messages) if predicate(m)), None)
            if found is not None:
                return found
            time.sleep(0.1)
        raise AssertionError(f"no matching websocket message in {timeout_s} s; got {self.messages[-5:]}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)


def start_cluster_ids_at(first: int) -> None:
    """Make the next cluster's id `first`.

    Ray node markers, workdirs and temp dirs are named after the cluster id (`volt-<id>`); every test
    database starts ids at 1, so tests running at once on one machine would share names and stop each
    other's nodes. A random high start keeps this test's clusters apart.
    """
    from django.db import connection

    from clusters.models import Cluster

    table = Cluster._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), %s, false)", [first])
        else:  # SQLite AUTOINCREMENT: the sequence row follows the largest id ever used
            cursor.execute("UPDATE sqlite_sequence SET seq = %s WHERE name = %s", [first - 1, table])
            if cursor.rowcount == 0:
                cursor.execute("INSERT INTO sqlite_sequence (name, seq) VALUES (%s, %s)", [table, first - 1])
