"""The benchmark commands of docs/benchmarks.md run as written, from a shell with none of Volt's variables.

Issue 24.7: `bench/inventory.py` and `bench/placement.py` failed as documented once DEBUG=0 became the
default (no SECRET_KEY; with one, every API call answered 301 to https), and nothing noticed. Here:
- every `bench/*.py` the page names exists and takes every flag the page gives it (its `--help`);
- the database benches run at their smallest sizes on PostgreSQL (the page's "on PostgreSQL"): their
  documented command with small sizes added, in a fresh process whose environment holds no DEBUG,
  SECRET_KEY or DJANGO_SETTINGS_MODULE, as a new clone's shell;
- the in-memory churn benches at their smallest sizes.
The Ray benches (provisioning, first_step, job_logs, recovery, ray_train_baseline, fabric, realtime) start
clusters or servers for minutes: only their flags are checked here; their own setup sets their settings.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks.md"
PG_ADMIN = "postgres://postgres@127.0.0.1:5432/postgres"
# `bench/x.py` and the flags after it, in a code block or an inline code span.
COMMAND = re.compile(r"bench/(\w+)\.py((?:[ \t]+\[?--[\w-]+(?:[ =][^\s\]`#]+)?\]?)*)")


def documented() -> dict[str, set[str]]:
    """Script -> every flag docs/benchmarks.md gives it."""
    found: dict[str, set[str]] = {}
    for script, args in COMMAND.findall(DOC.read_text()):
        found.setdefault(script, set()).update(re.findall(r"--[\w-]+", args))
    return found


def fresh_shell_env(tmp_path: Path) -> dict[str, str]:
    """A new clone's shell: none of the variables pytest or Volt's settings put in this process."""
    volt = ("DEBUG", "SECRET_KEY", "DJANGO_SETTINGS_MODULE", "DATABASE_URL", "VOLT_", "ALLOWED_HOSTS")
    env = {k: v for k, v in os.environ.items() if not k.startswith(volt)}
    env["VOLT_DATA_DIR"] = str(tmp_path / "var")  # its own Redis database index, not this checkout's
    return env


def bench(tmp_path: Path, script: str, *args: str, timeout_s: float = 600) -> dict:
    run = subprocess.run(
        [sys.executable, f"bench/{script}.py", *args],
        cwd=REPO, env=fresh_shell_env(tmp_path), capture_output=True, text=True, timeout=timeout_s,
    )  # fmt: skip
    assert run.returncode == 0, f"bench/{script}.py {' '.join(args)}:\n{(run.stdout + run.stderr)[-3000:]}"
    return json.loads(run.stdout.strip().splitlines()[-1])  # every bench ends with one JSON line


@pytest.fixture
def bench_database():
    """A PostgreSQL database name of this run's own (the bench creates and drops it)."""
    import psycopg

    try:
        psycopg.connect(PG_ADMIN, connect_timeout=3).close()
    except psycopg.OperationalError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL does not answer at {PG_ADMIN}: {exc}")
        pytest.skip(f"the inventory and placement benches need PostgreSQL at {PG_ADMIN}: {exc}")
    return f"postgres://postgres@127.0.0.1:5432/volt_bench_docs_{os.getpid()}"


def test_every_documented_bench_exists_and_takes_the_flags_the_page_gives_it():
    commands = documented()
    assert {"inventory", "placement", "churn", "recovery"} <= set(commands), commands
    for script, flags in sorted(commands.items()):
        path = REPO / "bench" / f"{script}.py"
        assert path.exists(), f"docs/benchmarks.md names bench/{script}.py, which does not exist"
        helped = subprocess.run(
            [sys.executable, str(path), "--help"], cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert helped.returncode == 0, helped.stderr[-2000:]
        unknown = {flag for flag in flags if flag not in helped.stdout}
        assert not unknown, (
            f"docs/benchmarks.md gives bench/{script}.py {sorted(unknown)}, which it does not take"
        )


def test_the_inventory_bench_runs_as_documented_at_its_smallest_size(tmp_path, bench_database):
    figures = bench(tmp_path, "inventory", "--hosts", "300", "--requests", "3", "--warmup", "1",
                    "--database-url", bench_database)  # fmt: skip
    assert figures["bench"] == "inventory" and figures["hosts"] == 300
    assert all(s["matched"] >= 0 and s["p95_ms"] > 0 for s in figures["scenarios"].values())


def test_the_placement_bench_runs_as_documented_at_its_smallest_sizes(tmp_path, bench_database):
    figures = bench(tmp_path, "placement", "--sizes", "1000", "--repeats", "3", "--endpoint-hosts", "2000",
                    "--endpoint-requests", "3", "--database-url", bench_database)  # fmt: skip
    assert figures["bench"] == "placement"
    assert figures["endpoint"]["1x8"]["placed"] == 3, figures["endpoint"]


def test_the_churn_benches_run_as_documented_at_their_smallest_sizes(tmp_path):
    small = ("--hosts", "1000", "--hours", "1")
    assert bench(tmp_path, "churn", "--load", "1.1", *small)["bench"] == "churn"
    assert bench(tmp_path, "churn", "--load", "1.1", "--flat-prices", *small)["flat_prices"] is True
    summary = bench(tmp_path, "churn", "--load", "1.1", "--comm-share", "0.05", *small)
    assert summary["comm_share"] == 0.05
    goodput = summary["policies"]["volt_goodput"]  # issue 28's policy, with the keys it promises
    wanted = {"useful_utilisation", "mean_wait_s", "p95_wait_s", "max_wait_s", "starved", "quota_violations"}
    assert wanted <= goodput.keys() and goodput["quota_violations"] == 0
    assert summary["policies"]["volt"].keys() - {"bounded"} <= goodput.keys()  # today's keys kept
    assert bench(tmp_path, "churn_diagnose", *small, "--day", "2")["bench"] == "churn_diagnose"


# --- docs/cli.md -----------------------------------------------------------------------------------

CLI_DOC = REPO / "docs" / "cli.md"
# `volt ...` or `python3 ci/volt.py ...` in a code block (after `$ `, an environment prefix or a YAML `- `).
VOLT_COMMAND = re.compile(r"(?:^|[\s$])(?:volt|python3 ci/volt\.py)\s+((?:clusters|jobs|--)\S*.*)$")


def cli_doc_commands() -> list[str]:
    """Every `volt` command line of docs/cli.md's code blocks, continuation lines joined (a shell's `\\`,
    YAML's folded lines that are indented further), shell expansions replaced by a cluster id."""
    blocks = re.findall(r"```[a-z]*\n(.*?)```", CLI_DOC.read_text(), flags=re.S)
    commands = []
    for block in blocks:
        if "[--" in block:  # the usage synopsis (placeholders), not commands to run
            continue
        lines: list[tuple[str, int]] = []  # (line, indent of its first physical line)
        for line in block.splitlines():
            indent = len(line) - len(line.lstrip())
            previous, depth = lines[-1] if lines else ("", 0)
            shell = previous.endswith("\\")
            folded = (  # a YAML list item holding a volt command, continued on more indented lines
                previous.lstrip().startswith("- ")
                and "volt" in previous
                and indent > depth
                and not line.lstrip().startswith("- ")
            )
            if shell or folded:
                lines[-1] = (previous.rstrip("\\ ") + " " + line.strip(), depth)
            else:
                lines.append((line, indent))
        for line, _ in lines:
            match = VOLT_COMMAND.search(line.split(" #")[0])
            if match:
                commands.append(match.group(1))
    return commands


def test_every_volt_command_in_the_cli_guide_parses():
    from voltweb import cli

    commands = cli_doc_commands()
    assert any(c.startswith("jobs submit") for c in commands) and len(commands) > 10, commands
    for command in commands:
        text = re.sub(r'"\$\(.*?\)"|\$\{\{[^}]*\}\}|\$\w+', "7", command)
        text = re.sub(r"\s*(?:>|\|).*$", "", text)  # the output's redirection or pipe
        words = shlex.split(text)
        try:
            cli.build_parser().parse_args(words)
        except (SystemExit, cli.UsageError) as exc:
            pytest.fail(f"docs/cli.md: `volt {command}` does not parse: {exc}")


def test_the_cli_guide_never_calls_a_clusters_head_without_its_token():
    """Every cluster's head answers 401 without its token: a `ray job submit` in the guide must carry it."""
    text = CLI_DOC.read_text()
    assert "next milestone" not in text
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
        if "ray job submit" in block:
            assert "RAY_AUTH_TOKEN=" in block and "RAY_AUTH_MODE=token" in block, block


# --- the other pages ---------------------------------------------------------------------------------

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_tables_are_whole_and_no_paragraph_is_said_twice(page):
    """docs/api.md had a table cut in two by a paragraph (its second half no longer a table) and the
    SSH key download described twice."""
    text = page.read_text()
    lines = text.splitlines()
    runs, start = [], None
    for number, line in enumerate([*lines, ""]):
        if line.startswith("|") and start is None:
            start = number
        elif not line.startswith("|") and start is not None:
            runs.append((start, number))
            start = None
    for first, end in runs:
        assert end - first >= 2 and re.match(r"^\|[\s:|-]+\|$", lines[first + 1]), (
            f"{page.name}:{first + 1}: table rows without a header: {lines[first][:80]}"
        )
    starts = [p.strip()[:60] for p in text.split("\n\n") if len(p.strip()) > 80 and not p.startswith("```")]
    repeated = {p for p in starts if starts.count(p) > 1}
    assert not repeated, f"{page.name} says these twice: {repeated}"


def test_the_architecture_page_tells_the_truth_about_retries_and_the_probe():
    """It claimed task retries that no task uses, and called the probe a Ray job in two places."""
    import clusters.tasks  # noqa: F401 - every task registered
    import inventory.tasks  # noqa: F401
    import jobs.tasks  # noqa: F401
    from voltweb.celery import app

    assert "jobs.tasks.poll_job_task" in app.tasks
    text = (REPO / "docs" / "architecture.md").read_text()
    retrying = sorted(name for name, task in app.tasks.items() if getattr(task, "autoretry_for", ()))
    assert retrying == [] and "no task names any" in text, (
        f"tasks that retry: {retrying}: say so in docs/architecture.md 'Tasks'"
    )
    assert "the probe job" not in text and "probe\n  ships as a Ray working_dir" not in text
