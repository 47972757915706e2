"""Volt's files are its own (DESIGN.md "Security"): on a machine where jobs run as other Unix users (local
hosts as root), nothing in the data dir that holds a secret may be readable by them.

- the data dir itself: 0711 — other users pass through it to what they are given (a local host's sandbox,
  a cluster's shared storage) but cannot list it;
- the SQLite database: 0600 from its creation (SQLite gives its -wal, -shm and -journal files the mode
  of the database file), so password hashes, tokens' digests and encrypted secrets stay Volt's;
- folders of Volt's own (job working dirs, the embedded Redis): 0700 where they are made.

Applied from settings, before anything opens the database; only to what Volt's user owns.
"""

from __future__ import annotations

import os
from pathlib import Path

DATA_DIR_MODE = 0o711
PRIVATE_FILE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700


def make_private(data_dir: Path, sqlite_file: Path | None = None) -> None:
    """Create the data dir (0711) and the SQLite file (0600) if missing; tighten them if they exist."""
    data_dir.mkdir(parents=True, exist_ok=True)
    _chmod_if_ours(data_dir, DATA_DIR_MODE)
    if sqlite_file is None:
        return
    sqlite_file.parent.mkdir(parents=True, exist_ok=True)
    try:  # an empty file is a new SQLite database: it is created with the mode it keeps
        os.close(os.open(sqlite_file, os.O_CREAT | os.O_WRONLY, PRIVATE_FILE_MODE))
    except OSError:
        return
    for path in (sqlite_file, *(Path(f"{sqlite_file}{suffix}") for suffix in ("-wal", "-shm", "-journal"))):
        _chmod_if_ours(path, PRIVATE_FILE_MODE)


def private_dir(path: Path) -> Path:
    """`path` made (with its parents) and closed to other users: 0700."""
    path.mkdir(parents=True, exist_ok=True)
    _chmod_if_ours(path, PRIVATE_DIR_MODE)
    return path


def _chmod_if_ours(path: Path, mode: int) -> None:
    try:
        if path.exists() and path.stat().st_uid == os.geteuid() and (path.stat().st_mode & 0o777) != mode:
            path.chmod(mode)
    except OSError:
        pass  # a read-only mount, a file of another user: nothing Volt may change
