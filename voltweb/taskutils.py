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
    retry_on: tuple[type[BaseException], ...] = (),
    max_retries: int = 3,
) -> Callable:
    """Register a task on `queue`; only `retry_on` errors (transient ones) are retried, with backoff.

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
            "autoretry_for": retry_on,
            "retry_backoff": 2,
            "retry_backoff_max": 60,
            "retry_jitter": True,
            "max_retries": max_retries,
        }
        if soft_time_limit is not None:
            options["soft_time_limit"] = soft_time_limit
        if time_limit is not None:
            options["time_limit"] = time_limit
        return app.task(**options)(run)

    return wrap


def enqueue_on_commit(task, *args, **kwargs) -> None:
    """Send `task` only once the surrounding transaction commits, so the worker sees the rows."""
    transaction.on_commit(lambda: task.delay(*args, **kwargs))
