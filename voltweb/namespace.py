"""Per-install namespace: what keeps two Volt checkouts on one machine out of each other's way.

Everything shared by every Volt on a machine is keyed by a short id derived from the install's data
dir (VOLT_DATA_DIR, resolved): the Redis DB index (when REDIS_URL is not set), the Ray cluster ids and
with them the process markers, workdirs and temp folders of Ray nodes, and where the search for a free
Ray port slot starts. A second checkout (its demo, its tests) therefore neither takes the first's
Celery tasks nor stops, or collides with, its Ray nodes. Pure functions: settings.py imports this.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

# Redis servers have 16 databases by default; 0 is left to whatever else runs on the machine.
_REDIS_DBS = 15
# Ray port slots 0..99 (clusters/provisioning/ray_nodes.py); an install starts its search at one of
# these, so two installs provisioning at once do not race for the same free slot.
_SLOT_STARTS = (0, 10, 20, 30, 40, 50, 60, 70)


@lru_cache(maxsize=64)
def install_id(data_dir: str | Path) -> str:
    """Six hex digits naming the install whose data dir this is (stable across runs and restarts)."""
    resolved = str(Path(data_dir).expanduser().resolve())
    return hashlib.sha256(resolved.encode()).hexdigest()[:6]


def redis_db(data_dir: str | Path) -> int:
    """The Redis DB index (1..15) this install uses when REDIS_URL is not given."""
    return 1 + int(install_id(data_dir), 16) % _REDIS_DBS


def default_redis_url(data_dir: str | Path) -> str:
    return f"redis://127.0.0.1:6379/{redis_db(data_dir)}"


def ray_temp_root(data_dir: str | Path | None = None) -> str:
    """Parent of the install's Ray temp folders: /tmp/volt-ray/<id> (20 characters; Ray's limit is ~40);
    without `data_dir`, the running install's (current_id)."""
    return f"/tmp/volt-ray/{current_id() if data_dir is None else install_id(data_dir)}"


def first_slot(data_dir: str | Path | None = None) -> int:
    """Where the install starts looking for a free Ray port slot on a machine (the running one's by default)."""
    ident = current_id() if data_dir is None else install_id(data_dir)
    return _SLOT_STARTS[int(hashlib.sha256(ident.encode()).hexdigest()[:6], 16) % len(_SLOT_STARTS)]


def current_id() -> str:
    """The running install's id: VOLT_INSTALL_ID, else derived from settings.VOLT_DATA_DIR (read at call
    time: tests change them). Workers on other machines have data dirs of their own: a deployment that runs
    Volt's processes on several machines gives them all one VOLT_INSTALL_ID."""
    from django.conf import settings

    return getattr(settings, "VOLT_INSTALL_ID", "") or install_id(settings.VOLT_DATA_DIR)


def install_seed() -> str:
    """What names this install's Unix users on hosts (clusters/provisioning/node_users.user_name)."""
    from django.conf import settings

    return getattr(settings, "VOLT_INSTALL_ID", "") or str(Path(settings.VOLT_DATA_DIR).resolve())


def channel_prefix(redis_url: str) -> str:
    """The websocket channel layer's prefix for this Redis URL. The layer uses Redis pub/sub, whose channels
    are server-wide (not per database index): installs on one server, each on its own database, must not
    hear each other's `cluster-1`."""
    return "volt" + hashlib.sha256(redis_url.encode()).hexdigest()[:8] + ":"
