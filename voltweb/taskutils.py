"""The one decorator every Volt Celery task uses: queue, time limits and retry policy in one place."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from django.core.exceptions import ObjectDoesNotExist
from django.db import transaction

from voltweb.celery import app

logger = logging.getLogger(__name__)
GONE = "gone"


def volt_task(
    queue: str,
    *,
    soft_time_limit: int | None = None,
    time_limit: int | None = None,
) -> Callable:
    """Register a task on `queue`: acknowledged late, rejected (so redelivered) when its worker is lost.

    No task retries through Celery: each is idempotent, and what one leaves undone beat picks up again
    (the next poll or sweep, the reapers). A retry option nobody passed was dropped (issue 22).

    A task whose row no longer exists (deleted meanwhile, or a message meant for another Volt that
    shares the broker) has nothing to do: it logs a warning and returns "gone" instead of failing.
    """

    def wrap(fn: Callable) -> Callable:
        name = f"{fn.__module__}.{fn.__name__}"

        @functools.wraps(fn)
        def run(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except ObjectDoesNotExist as exc:
                logger.warning("%s%r: nothing to do, %s", name, args, exc)
                return GONE

        options = {
            "name": name,
            "queue": queue,
            "acks_late": True,
            "reject_on_worker_lost": True,
        }
        if soft_time_limit is not None:
            options["soft_time_limit"] = soft_time_limit
        if time_limit is not None:
            options["time_limit"] = time_limit
        return app.task(**options)(run)

    return wrap


def registered(name: str):
    """The task registered as `name` ("clusters.tasks.place_cluster_task"). The web process need not have
    imported the tasks module: Celery's autodiscovery (every app's tasks.py) runs on first use."""
    try:
        return app.tasks[name]
    except KeyError:
        app.loader.import_default_modules()
        return app.tasks[name]


def enqueue(name: str, *args, **kwargs) -> None:
    """Send the task registered as `name` now, on the queue it declares."""
    registered(name).delay(*args, **kwargs)


def enqueue_on_commit(name: str, *args, **kwargs) -> None:
    """Send the task registered as `name` once the surrounding transaction commits, so the worker sees
    the rows (at once when there is no transaction).

    Work is enqueued by the task's stable name, never by importing it: nothing below an app's tasks.py
    imports it (CONVENTIONS.md, "Enqueue by stable task name").
    """
    transaction.on_commit(lambda: enqueue(name, *args, **kwargs))
