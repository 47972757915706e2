"""Start the all-reduce probe on a cluster's hosts and read its result (the caller's side; no Django).

One process per host, started at once through the host's driver (local sandbox or SSH), with the
probe's source on its standard input (nothing to copy, nothing left behind):

    <the node's launcher: user, env, cwd> <python> - --rank R --world N ... <<'VOLT_PROBE_EOF'
    <clusters/probes/allreduce.py>
    VOLT_PROBE_EOF

Rank 0 runs on the head's host and serves the rendezvous on `port`; its output carries the
VOLT_PROBE_RESULT line. Every rank carries `VOLT_PROBE_RUN=<this run's id>` in its environment: when
one rank fails (its host unreachable, its process exits with an error), the caller kills the others by
that mark at once instead of leaving them to wait out the rendezvous for a rank that never comes.
"""

from __future__ import annotations

import secrets
import shlex
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusters.probes import allreduce
from inventory.drivers.base import CommandResult, DriverError, HostDriver, fan_out

_EOF = "VOLT_PROBE_EOF"
RUN_MARKER_VAR = "VOLT_PROBE_RUN"


@dataclass(frozen=True)
class ProbeHost:
    """One rank's host: its driver, the IP its node uses, and how its node's processes start."""

    driver: HostDriver
    node_ip: str
    python: str
    launcher: str = ""  # the prefix the node's Ray runs under (ray_nodes.launcher): user, environment, cwd


@dataclass(frozen=True)
class ProbeRun:
    """What the probe did: SUCCEEDED with rank 0's result, or FAILED / ERROR with the ranks' output."""

    status: str
    output: str
    result: dict[str, Any] | None


def rank_command(host: ProbeHost, arguments: Sequence[str], run_id: str) -> str:
    """The shell command that runs one rank on `host`, the probe's source on its standard input."""
    source = Path(allreduce.__file__).read_text()
    if any(line.strip() == _EOF for line in source.splitlines()):
        raise ValueError(f"the probe's source holds the line {_EOF}, which ends its here-document")
    words = " ".join(shlex.quote(word) for word in arguments)
    prefix = host.launcher or "env"  # the launcher ends with its environment: the mark joins it
    return (
        f"{prefix} {RUN_MARKER_VAR}={run_id} {shlex.quote(host.python)} - {words} "
        f"<<'{_EOF}'\n{source}\n{_EOF}\n"
    )


def kill_command(run_id: str) -> str:
    """Shell: SIGKILL every process of this host that carries the run's mark (nothing else)."""
    mark = shlex.quote(f"{RUN_MARKER_VAR}={run_id}")
    return (
        f"for f in $(grep -lzxF {mark} /proc/[0-9]*/environ 2>/dev/null); do "
        'p=${f#/proc/}; kill -KILL "${p%/environ}" 2>/dev/null; done; true'
    )


def run_probe(
    hosts: Sequence[ProbeHost],
    port: int,
    *,
    plan: allreduce.ProbePlan | None = None,
    max_mb: int = 256,
    iters: int = 10,
    warmup: int = 2,
    timeout_s: float = 600.0,
    rendezvous_timeout_s: float | None = None,
    hosts_below_gbps: float | None = None,
) -> ProbeRun:
    """Run the probe over `hosts` (rank 0 = hosts[0], whose `port` must be free) and wait for every rank.

    The plan's budget counts from the launch: the ranks' start-up (the driver's command, `import torch`,
    the rendezvous) is inside it. `wall_s` in the result is the whole probe as this caller saw it.
    `hosts_below_gbps`: the per-host phase runs only when the sweep measures below it (None: always)."""
    world = len(hosts)
    if world < 2:
        raise ValueError("the all-reduce probe needs two hosts or more")
    launched = time.time()
    budget = plan.budget_s if plan else None
    rendezvous = rendezvous_timeout_s or min(timeout_s, max(60.0, 5 * (budget or 12.0)))
    common = ["--world", str(world), "--master", hosts[0].node_ip, "--port", str(port),
              "--max-mb", str(max_mb), "--iters", str(iters), "--warmup", str(warmup),
              "--submitted-unix", f"{launched:.3f}", "--rendezvous-timeout-s", f"{rendezvous:g}"]  # fmt: skip
    if hosts_below_gbps is not None:
        common += ["--hosts-below-gbps", f"{hosts_below_gbps:.6g}"]
    if plan is not None:
        common += ["--sizes", ",".join(str(size) for size in plan.sizes), "--link-bytes", str(plan.link_bytes),
                   "--local-bytes", str(plan.local_bytes), "--budget-s", f"{plan.budget_s:g}"]  # fmt: skip
    run_id = secrets.token_hex(8)
    commands = [
        rank_command(host, ["--rank", str(rank), "--node-ip", host.node_ip, *common], run_id)
        for rank, host in enumerate(hosts)
    ]
    outcomes = _run_ranks(hosts, commands, run_id, timeout_s)
    finished = time.time()
    problems = []
    for rank, (host, outcome) in enumerate(zip(hosts, outcomes, strict=True)):
        if outcome is None:  # killed: another rank failed first
            continue
        if isinstance(outcome, DriverError):
            problems.append(f"rank {rank} on {host.node_ip}: {outcome}")
        elif isinstance(outcome, BaseException):
            raise outcome
        elif not outcome.ok:
            text = (outcome.stderr.strip() or outcome.stdout.strip()).splitlines()[-8:]
            problems.append(f"rank {rank} on {host.node_ip} exited {outcome.exit_status}: " + "\n".join(text))
    if problems:
        status = "ERROR" if any(isinstance(o, DriverError) for o in outcomes) else "FAILED"
        return ProbeRun(status, "\n".join(problems), None)
    output = outcomes[0].stdout
    try:
        result = allreduce.parse_result(output)
    except ValueError as exc:
        return ProbeRun("FAILED", str(exc), None)
    allreduce.add_launch_times(result, launched, finished)
    return ProbeRun("SUCCEEDED", output, result)


def _run_ranks(
    hosts: Sequence[ProbeHost], commands: list[str], run_id: str, timeout_s: float
) -> list[CommandResult | BaseException | None]:
    """Every rank at once; the first to fail gets the others killed (their outcome: None)."""

    def run(index: int) -> CommandResult:
        result = hosts[index].driver.run(commands[index], timeout=timeout_s)
        if not result.ok:
            raise _RankFailed(result)
        return result

    with ThreadPoolExecutor(max_workers=len(hosts)) as pool:
        futures = [pool.submit(run, index) for index in range(len(hosts))]
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        if pending:  # one failed: the others would wait out the rendezvous for it
            fan_out(
                [host.driver for host in hosts], lambda driver: driver.run(kill_command(run_id), timeout=30)
            )
        wait(pending)
    outcomes: list[CommandResult | BaseException | None] = []
    for future in futures:
        error = future.exception()
        if isinstance(error, _RankFailed):
            outcomes.append(None if future in pending and _killed(error.result) else error.result)
        else:
            outcomes.append(error if error is not None else future.result())
    return outcomes


def _killed(result: CommandResult) -> bool:
    return result.exit_status in (137, -9)  # SIGKILL, through a shell or not


class _RankFailed(Exception):
    def __init__(self, result: CommandResult):
        super().__init__(result.exit_status)
        self.result = result
