"""Starting the probe on every host (clusters/probes/launch.py); the host driver is the seam."""

from __future__ import annotations

import json
import threading

import pytest

from clusters.probes import allreduce, launch
from clusters.probes.launch import ProbeHost, run_probe
from inventory.drivers.base import CommandResult, HostUnreachable

RESULT = allreduce.RESULT_PREFIX + json.dumps(
    {"nodes": 2, "backend": "gloo", "results": [], "max_busbw_gbps": 1.5, "started_unix": 1000.0}
)


class Host:
    """A host driver: `answer(command)` gives the rank's result; kill commands are recorded apart."""

    def __init__(self, address: str, answer):
        self.address = address
        self.answer = answer
        self.commands: list[str] = []
        self.kills: list[str] = []
        self.killed = threading.Event()

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        if command.startswith("for f in $(grep -lzxF"):
            self.kills.append(command)
            self.killed.set()
            return CommandResult(0, "", "")
        self.commands.append(command)
        return self.answer(self)


def ok(output: str = ""):
    return lambda host: CommandResult(0, output, "")


def waits_until_killed(host: Host) -> CommandResult:
    """A rank that waits for a peer that never comes, until the caller kills it (SIGKILL: 137)."""
    assert host.killed.wait(10), "the caller never killed the waiting rank"
    return CommandResult(137, "", "")


def test_every_rank_gets_the_probe_source_its_rank_and_the_runs_mark():
    hosts = [Host("10.0.0.1", ok(RESULT)), Host("10.0.0.2", ok())]
    plan = allreduce.budget_plan(10.0, 5.0, 2, 10, 2, 64 * allreduce.MB)

    probe = run_probe(
        [ProbeHost(h, h.address, "/opt/py/bin/python", "env -i A=1") for h in hosts], 20011, plan=plan,
        hosts_below_gbps=5.0,
    )  # fmt: skip

    assert probe.status == "SUCCEEDED" and probe.result["max_busbw_gbps"] == 1.5
    assert probe.result["wall_s"] >= 0 and "launch_s" in probe.result["phases_s"]
    for rank, host in enumerate(hosts):
        (command,) = host.commands
        words = command.split("<<")[0].split()
        assert words[:4] == ["env", "-i", "A=1", words[3]] and words[3].startswith("VOLT_PROBE_RUN=")
        assert words[4:6] == ["/opt/py/bin/python", "-"]
        assert words[words.index("--rank") + 1] == str(rank)
        assert words[words.index("--node-ip") + 1] == host.address
        assert (
            words[words.index("--master") + 1] == "10.0.0.1" and words[words.index("--port") + 1] == "20011"
        )
        assert words[words.index("--hosts-below-gbps") + 1] == "5"
        assert words[words.index("--budget-s") + 1] == "5"
        assert "def run_rank(" in command and command.rstrip().endswith("VOLT_PROBE_EOF")
    assert hosts[0].commands[0].split()[3] == hosts[1].commands[0].split()[3]  # one mark per run
    assert not hosts[0].kills and not hosts[1].kills


def test_an_unreachable_host_fails_the_probe_and_the_waiting_ranks_are_killed():
    def unreachable(host):
        raise HostUnreachable("10.0.0.2 is not answering")

    hosts = [Host("10.0.0.1", waits_until_killed), Host("10.0.0.2", unreachable)]

    probe = run_probe([ProbeHost(h, h.address, "python") for h in hosts], 20011)

    assert probe.status == "ERROR" and probe.result is None
    assert probe.output == "rank 1 on 10.0.0.2: 10.0.0.2 is not answering"  # the killed rank 0 says nothing
    mark = hosts[0].commands[0].split()[1]
    assert all(mark in kill for host in hosts for kill in host.kills) and hosts[0].kills


def test_a_rank_that_exits_with_an_error_fails_the_probe_with_its_output():
    failing = lambda host: CommandResult(1, "", "Traceback\nModuleNotFoundError: No module named 'torch'")  # noqa: E731
    hosts = [
        Host("10.0.0.1", waits_until_killed),
        Host("10.0.0.2", failing),
        Host("10.0.0.3", waits_until_killed),
    ]

    probe = run_probe([ProbeHost(h, h.address, "python") for h in hosts], 20011)

    assert probe.status == "FAILED" and probe.result is None
    assert (
        probe.output == "rank 1 on 10.0.0.2 exited 1: Traceback\nModuleNotFoundError: No module named 'torch'"
    )


def test_rank_0_without_a_result_line_fails_the_probe():
    hosts = [Host("10.0.0.1", ok("something else\n")), Host("10.0.0.2", ok())]

    probe = run_probe([ProbeHost(h, h.address, "python") for h in hosts], 20011)

    assert probe.status == "FAILED" and "printed no VOLT_PROBE_RESULT line" in probe.output
    assert "something else" in probe.output


def test_one_host_is_refused_and_the_per_host_phase_is_left_to_the_ranks_by_default():
    with pytest.raises(ValueError, match="two hosts or more"):
        run_probe([ProbeHost(Host("10.0.0.1", ok()), "10.0.0.1", "python")], 20011)
    hosts = [Host("10.0.0.1", ok(RESULT)), Host("10.0.0.2", ok())]
    run_probe([ProbeHost(h, h.address, "python") for h in hosts], 20011)
    assert "--hosts-below-gbps" not in hosts[0].commands[0].split("<<")[0]


def test_the_kill_command_matches_the_runs_mark_exactly():
    assert f"{launch.RUN_MARKER_VAR}=abc" in launch.kill_command("abc")
    assert "grep -lzxF" in launch.kill_command("abc")  # whole NUL-separated entries: abc never kills abcd
