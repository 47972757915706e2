"""`volt goodput`: where your teams' GPU time went (GET /api/v1/goodput/, jobs/goodput.py on the server).

    volt goodput [--team SLUG] [--since 2026-12-01] [--until 2026-12-07] [--csv]
    volt goodput --cluster N        one cluster's ledger
    volt goodput --job N            one job's ledger

Prints a table (category, hours, GPU-hours, share) by default, the API's JSON with --json, its CSV export
with --csv. Nothing here imports Django: the CLI is a client of the REST API (voltweb/cli.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

CATEGORIES = ("productive", "queued", "provisioning", "verification", "checkpoint_save", "recovery",
              "lost_work", "idle", "teardown")  # fmt: skip


def _whole_number(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, not {value!r}")
    return int(value)


def add_goodput_command(resources, connection, *, emit: Callable[[Any], None]) -> None:
    sub = resources.add_parser(
        "goodput",
        help="where your teams' GPU time went: productive, queued, recovery, lost work, idle ...",
        description="Where your teams' GPU time went, per category, from Volt's recorded timelines.",
        parents=[connection],
    )
    which = sub.add_mutually_exclusive_group()
    which.add_argument("--cluster", type=_whole_number, metavar="ID", help="one cluster's ledger")
    which.add_argument("--job", type=_whole_number, metavar="ID", help="one job's ledger")
    sub.add_argument("--team", help="a team's slug (default: all of yours)")
    sub.add_argument("--since", help="a date (2026-12-01) or ISO time; default 30 days ago")
    sub.add_argument("--until", help="a date or ISO time; default now")
    out = sub.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="the API's JSON")
    out.add_argument("--csv", action="store_true", help="day,team,provider,category,gpu_hours rows")
    sub.set_defaults(handler=lambda client, args: cmd_goodput(client, args, emit))


def cmd_goodput(client, args: argparse.Namespace, emit: Callable[[Any], None]) -> int:
    window = {"team": args.team, "since": args.since, "until": args.until}
    if args.cluster or args.job:
        path = f"/goodput/clusters/{args.cluster}/" if args.cluster else f"/jobs/{args.job}/goodput/"
        ledger = client.get(path)
        if args.json or args.csv:
            emit(ledger)
            return 0
        what = f"cluster {args.cluster}" if args.cluster else f"job {args.job}"
        sys.stdout.write(f"{what}: {ledger['wall_s'] / 3600:.2f} h wall-clock, from {ledger['start']}\n")
        sys.stdout.write(table(ledger["seconds"], ledger["gpu_hours"]))
        return 0
    if args.csv:
        sys.stdout.write(client.get_csv("/goodput/", window))
        return 0
    report = client.get("/goodput/", window)
    if args.json:
        emit(report)
        return 0
    sys.stdout.write(f"{report['since'][:10]} to {report['until'][:19]}: {report['clusters']} clusters\n")
    for team in report["teams"]:
        sys.stdout.write(f"\nteam {team['team']}\n")
        sys.stdout.write(table(team["totals"]["seconds"], team["totals"]["gpu_hours"]))
    if not report["teams"]:
        sys.stdout.write("no cluster of yours lived in this window\n")
    return 0


def table(seconds: dict[str, float], gpu_hours: dict[str, float]) -> str:
    """category, hours, GPU-hours and share of GPU-hours, the categories with any time."""
    held = sum(gpu_hours.values())
    lines = [f"  {'category':<16}{'hours':>10}{'GPU-hours':>12}{'share':>8}"]
    for key in CATEGORIES:
        if not seconds.get(key) and not gpu_hours.get(key):
            continue
        share = 100.0 * gpu_hours.get(key, 0) / held if held else 0.0
        lines.append(
            f"  {key:<16}{seconds.get(key, 0) / 3600:>10.2f}{gpu_hours.get(key, 0):>12.2f}{share:>7.1f}%"
        )
    lines.append(f"  {'total':<16}{sum(seconds.values()) / 3600:>10.2f}{held:>12.2f}")
    return "\n".join(lines) + "\n"
