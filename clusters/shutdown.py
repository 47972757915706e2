"""Stopping what this install runs on its hosts: the demo's Ctrl-C ("stops everything it started").

The demo's worker starts Ray nodes (detached, in sessions of their own) for every cluster it brings up;
they outlive the worker by design. When the demo stops, every cluster that holds GPUs is terminated
for real (nodes stopped, keys removed, GPUs released, status TERMINATED with the reason), and a last
sweep kills any process on this machine still carrying this install's Ray node marker (a node whose
start was cut short before its row recorded it), then removes the install's Ray temp folders.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import time
from pathlib import Path

from django.conf import settings

from clusters import transitions
from clusters.choices import HOLDS_GPUS, ClusterStatus
from clusters.models import Cluster
from clusters.provisioning.ray_nodes import NODE_MARKER_VAR
from clusters.services import finish_termination, terminate_cluster
from voltweb import namespace

logger = logging.getLogger(__name__)


def stop_all_clusters(reason: str) -> list[str]:
    """Terminate every cluster holding GPUs and wait for it (host work done here); returns their names."""
    stopped = []
    for cluster in Cluster.objects.filter(status__in=HOLDS_GPUS).order_by("pk"):
        try:
            transitions.note(cluster, reason, heartbeat=True)
            if cluster.status == ClusterStatus.TERMINATING:
                finish_termination(cluster)
            else:
                terminate_cluster(cluster, wait=True)
            stopped.append(cluster.name)
        except Exception:  # noqa: BLE001 - one cluster's trouble must not keep the others running
            logger.exception("could not terminate cluster %s", cluster.pk)
    return stopped


def install_node_pids() -> list[int]:
    """PIDs on this machine of this install's Ray node processes (local hosts run on this machine).

    The environment marker alone misses some: Ray's agents and workers set their process title over
    their environment (/proc/PID/environ then reads as zeros). Every one of them still works in this
    install's host sandboxes or Ray temp folder (cwd) or writes its logs there (open files), so those
    are matched too.
    """
    prefix = f"{NODE_MARKER_VAR}=volt-{namespace.current_id()}-".encode()
    places = (
        str(Path(settings.VOLT_DATA_DIR).resolve() / "hosts") + "/",
        namespace.ray_temp_root() + "/",
    )
    own = os.getpid()
    return sorted(
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and int(entry.name) != own and _belongs(entry, prefix, places)
    )


def _belongs(proc: Path, prefix: bytes, places: tuple[str, ...]) -> bool:
    try:
        if any(item.startswith(prefix) for item in (proc / "environ").read_bytes().split(b"\0")):
            return True
        links = [proc / "cwd", *(proc / "fd").iterdir()]
    except OSError:  # gone, or another user's
        return False
    for link in links:
        try:
            target = os.readlink(link)
        except OSError:
            continue
        if (target + "/").startswith(places):
            return True
    return False


def kill_leftover_nodes(wait_s: float = 5.0) -> list[int]:
    """SIGKILL this install's remaining Ray node processes; returns the PIDs that were found.

    Called once the demo's own web, worker and beat have exited (their cwd is the checkout, not a sandbox).
    """
    pids = install_node_pids()
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + wait_s
    while install_node_pids() and time.monotonic() < deadline:
        time.sleep(0.2)
    if not install_node_pids():
        shutil.rmtree(namespace.ray_temp_root(), ignore_errors=True)
    return pids
