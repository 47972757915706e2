"""What other apps ask to happen around a cluster's lifecycle, without clusters importing them.

Dependencies point jobs -> clusters, yet terminating a cluster must stop its jobs first and a degraded
cluster interrupts them. An app registers plain functions here (in its AppConfig.ready); clusters call
them at two points: `before_teardown(cluster)` in the worker that stops the cluster's processes, and
`status_changed(cluster, previous, target, reason)` once a status change has committed. A failing hook
is logged and never stops the cluster's own work.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

logger = logging.getLogger(__name__)

_before_teardown: list[Callable] = []
_status_listeners: list[Callable] = []


def on_before_teardown(fn: Callable) -> None:
    """`fn(cluster)` runs before a terminated cluster's processes are stopped (a worker; may reach hosts)."""
    if fn not in _before_teardown:
        _before_teardown.append(fn)


def on_status_change(fn: Callable) -> None:
    """`fn(cluster, previous, target, reason)` runs after a cluster's status change commits (DB work only)."""
    if fn not in _status_listeners:
        _status_listeners.append(fn)


def before_teardown(cluster) -> None:
    for fn in list(_before_teardown):
        try:
            fn(cluster)
        except Exception:  # noqa: BLE001 - see the module docstring
            logger.exception("before-teardown hook %s failed for cluster %s", fn, cluster.pk)


def status_changed(cluster, previous: str, target: str, reason: str) -> None:
    for fn in list(_status_listeners):
        try:
            fn(cluster, previous, target, reason)
        except Exception:  # noqa: BLE001 - see the module docstring
            logger.exception("status hook %s failed for cluster %s", fn, cluster.pk)
