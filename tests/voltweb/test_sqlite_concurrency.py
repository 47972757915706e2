"""The demo's SQLite database under its own load: web, worker and beat write to one file at once.

Issue 24.1: a healthy host's onboarding failed with "database is locked" one second after Add host while
a job ran, and `poll_job_task` failed the same way. The pattern that failed is a transaction that reads
and then writes: in SQLite's default (deferred) mode it starts as a reader, and when another connection
has written meanwhile, its upgrade to a writer fails at once, whatever the busy timeout. Volt's settings
open SQLite transactions as writers (IMMEDIATE), so they wait their turn, and in WAL mode, so readers do
not wait for writers.

Each writer here is a separate process with Volt's real settings (voltweb.settings_test on top of
voltweb.settings) pointed at one SQLite file, as the demo's daphne, worker and beat are.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WRITERS = 4
TRANSACTIONS = 40

WRITER = r"""
import json, os, sys, time
import django
django.setup()
from django.db import connection, transaction

go, transactions = sys.argv[1], int(sys.argv[2])
while not os.path.exists(go):
    time.sleep(0.005)
errors = []
for i in range(transactions):
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                # Read, then write in the same transaction: how onboarding records a discovery.
                cursor.execute("SELECT value FROM counter WHERE id = 1")
                (value,) = cursor.fetchone()
                time.sleep(0.002)
                cursor.execute("UPDATE counter SET value = %s WHERE id = 1", [value + 1])
                cursor.execute("INSERT INTO entry (writer) VALUES (%s)", [os.getpid()])
    except Exception as exc:  # the test reports every failure, not only the first
        errors.append(f"{exc.__class__.__name__}: {exc}")
with connection.cursor() as cursor:
    cursor.execute("PRAGMA journal_mode")
    (journal_mode,) = cursor.fetchone()
name = connection.settings_dict["NAME"]
modes = {
    suffix: oct(os.stat(name + suffix).st_mode & 0o777)
    for suffix in ("", "-wal", "-shm")
    if os.path.exists(name + suffix)
}
print(json.dumps({"errors": errors, "journal_mode": journal_mode, "modes": modes}))
"""


def _writer_env(database: Path, data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL",)}
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "voltweb.settings_test",
            "DATABASE_URL": f"sqlite:///{database}",
            "VOLT_DATA_DIR": str(data_dir),
            "PYTHONPATH": str(ROOT),
        }
    )
    return env


def test_concurrent_read_then_write_transactions_on_sqlite_never_fail_with_database_locked(tmp_path):
    database = tmp_path / "volt.sqlite3"
    # The data files are private (0600): the WAL and shared-memory files SQLite adds must stay so.
    os.close(os.open(database, os.O_CREAT | os.O_WRONLY, 0o600))
    os.chmod(database, 0o600)
    import sqlite3

    with sqlite3.connect(database) as setup:
        setup.execute("CREATE TABLE counter (id INTEGER PRIMARY KEY, value INTEGER NOT NULL)")
        setup.execute("CREATE TABLE entry (id INTEGER PRIMARY KEY AUTOINCREMENT, writer INTEGER NOT NULL)")
        setup.execute("INSERT INTO counter (id, value) VALUES (1, 0)")
    setup.close()

    go = tmp_path / "go"
    env = _writer_env(database, tmp_path / "data")
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(go), str(TRANSACTIONS)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(WRITERS)
    ]
    time.sleep(0.5)
    go.touch()  # every writer starts at once, each process already set up
    reports = []
    for writer in writers:
        out, err = writer.communicate(timeout=300)
        assert writer.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))

    errors = [error for report in reports for error in report["errors"]]
    assert errors == [], f"{len(errors)} of {WRITERS * TRANSACTIONS} transactions failed: {errors[:3]}"
    with sqlite3.connect(database) as check:
        assert check.execute("SELECT value FROM counter").fetchone() == (WRITERS * TRANSACTIONS,)
        assert check.execute("SELECT COUNT(*) FROM entry").fetchone() == (WRITERS * TRANSACTIONS,)
    check.close()
    assert {report["journal_mode"] for report in reports} == {"wal"}
    for report in reports:
        assert set(report["modes"].values()) == {"0o600"}, report["modes"]
