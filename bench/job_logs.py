"""Following a chatty job's log: what one poll costs as the log grows, Volt beside Ray's log API.

    flock /tmp/volt-ray.lock .venv/bin/python bench/job_logs.py [--sizes 1,16,64] [--polls 5]

Sets up its own SQLite database and one local host (real onboarding) in a temporary folder and a READY
1-node cluster on it (bench/recovery.py's setup). For each size S (MB): a job prints S MB of log lines
(not all ASCII), then one line every 0.2 s (for at most 10 minutes; stopped when measured). Once its
Ray log holds S MB:

- Volt, catch-up: `jobs.poll_job` until the stored log has caught up with the file (the first polls after
  a burst: the log is read on the head host LOG_READ_MAX at a time, stored, events parsed); seconds
  and polls;
- Volt, steady: `--polls` polls once caught up (each reads the few lines written since the last one);
  median seconds and the peak of Python memory allocated during one (tracemalloc);
- baseline, what every poll did before: Ray's job API, `get_job_info` then `get_job_logs` (the whole log,
  JSON over HTTP from the head's dashboard), `--polls` times; median seconds and peak memory. Its own
  storing is not counted, so the baseline's figures are a floor.

Stored logs are capped at VOLT_JOB_LOG_MAX_MB (16 by default): past it Volt still reads (for events) but
stores nothing. The last line is the JSON summary.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench._common import emit_json, print_table  # noqa: E402

CHATTY = """import sys, time
target = int(sys.argv[1]) * 1024 * 1024
line = "step {:09d} loss={:.8f} — données ✓ " + "x" * 60 + "\\n"
written = i = 0
while written < target:
    text = line.format(i, 1 / (i + 1))
    sys.stdout.write(text)
    written += len(text.encode())
    i += 1
sys.stdout.flush()
deadline = time.time() + 600
while time.time() < deadline:
    print(line.format(i, 0.0), end="", flush=True)
    i += 1
    time.sleep(0.2)
"""


def timed(call) -> tuple[float, int]:
    """(seconds, peak bytes Python allocated) of one call."""
    tracemalloc.start()
    started = time.perf_counter()
    call()
    elapsed = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return elapsed, peak


def measure(cluster, user, size_mb: int, polls: int, workdir: Path) -> dict:
    from jobs import services as jobs
    from jobs.models import Job

    folder = workdir / f"chatty-{size_mb}"
    folder.mkdir()
    (folder / "chatty.py").write_text(CHATTY)
    job = jobs.submit_job(cluster, user, f"python chatty.py {size_mb}", working_dir=folder)
    jobs.start_job(job.pk)
    job = Job.objects.get(pk=job.pk)
    client = jobs.ray_client(cluster)
    try:
        deadline = time.monotonic() + 300
        while True:
            read = jobs.read_head_log(job, 0, 1)
            if read and read[1] >= size_mb * 1024 * 1024:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"the {size_mb} MB job did not write its log within 300 s")
            time.sleep(0.5)
        started, catch_up_polls = time.perf_counter(), 0
        while True:
            jobs.poll_job(job.pk)
            catch_up_polls += 1
            job = Job.objects.get(pk=job.pk)
            if job.ray_log_seen >= size_mb * 1024 * 1024:
                break
        catch_up_s = time.perf_counter() - started
        volt, base = [], []
        for _ in range(polls):  # alternating, so both see the same log size and machine load
            time.sleep(0.5)
            volt.append(timed(lambda: jobs.poll_job(job.pk)))
            base.append(timed(lambda: (client.get_job_info(job.ray_submission_id),
                                       client.get_job_logs(job.ray_submission_id))))  # fmt: skip
        log_mb = jobs.read_head_log(job, 0, 1)[1] / 1024 / 1024
        job = Job.objects.get(pk=job.pk)
        return {
            "log_mb": round(log_mb, 1),
            "stored_mb": round(job.log_size / 1024 / 1024, 1),
            "catch_up_s": round(catch_up_s, 2),
            "catch_up_polls": catch_up_polls,
            "volt_poll_s": round(statistics.median(s for s, _ in volt), 3),
            "volt_peak_mb": round(max(p for _, p in volt) / 1024 / 1024, 1),
            "ray_api_poll_s": round(statistics.median(s for s, _ in base), 3),
            "ray_api_peak_mb": round(max(p for _, p in base) / 1024 / 1024, 1),
        }
    finally:
        jobs.finish_stop(job.pk, "measured")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,16,64", help="log sizes in MB, comma-separated")
    parser.add_argument("--polls", type=int, default=5)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    from bench.recovery import setup

    with tempfile.TemporaryDirectory(prefix="volt-bench-logs-") as workdir:
        setup(Path(workdir), hosts=1)
        from bench.recovery import cluster_and_user
        from clusters import services

        cluster, user = cluster_and_user(1)
        try:
            results = {str(size): measure(cluster, user, size, args.polls, Path(workdir)) for size in sizes}
        finally:
            cluster.refresh_from_db()
            if cluster.status not in ("terminated", "failed"):
                services.terminate_cluster(cluster, wait=True)
    rows = [{"size_mb": size, **figures} for size, figures in results.items()]
    print_table(rows, ["size_mb", "log_mb", "stored_mb", "catch_up_s", "catch_up_polls", "volt_poll_s",
                       "volt_peak_mb", "ray_api_poll_s", "ray_api_peak_mb"])  # fmt: skip
    for row in rows:
        row["poll_time_ratio"] = round(row["ray_api_poll_s"] / row["volt_poll_s"], 1)
    emit_json({"bench": "job_logs", "sizes": results,
               "poll_time_ratio": {r["size_mb"]: r["poll_time_ratio"] for r in rows}})  # fmt: skip


if __name__ == "__main__":
    main()
