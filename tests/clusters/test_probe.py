"""The probe's arithmetic and its verdict on which host is slow (pure Python; Ray runs it in integration)."""

from __future__ import annotations

import pytest

from clusters.probes.allreduce import MB, message_sizes, ring_links, slowest_host, summarize, summarize_hosts


def result_with(local: list[float], links: list[float]) -> dict:
    ips = [f"127.0.0.{i + 2}" for i in range(len(local))]
    pairs = ring_links(len(local))
    return {"hosts": summarize_hosts(ips, local, [(a, b, g) for (a, b), g in zip(pairs, links, strict=True)])}


def test_ring_links_cover_every_host_twice_from_three_nodes():
    assert ring_links(1) == []
    assert ring_links(2) == [(0, 1)]
    assert ring_links(4) == [(0, 1), (1, 2), (2, 3), (3, 0)]


def test_summarize_reports_nccl_tests_figures_from_the_slowest_rank():
    summary = summarize(4, "gloo", [MB, 2 * MB], [[0.001, 0.002], [0.002, 0.004]])

    first = summary["results"][0]
    assert first["time_s"] == 0.002  # the slower rank's time
    assert first["algbw_gbps"] == pytest.approx(MB / 0.002 / 1e9)
    assert first["busbw_gbps"] == pytest.approx(first["algbw_gbps"] * 2 * 3 / 4)
    assert summary["max_busbw_gbps"] == max(r["busbw_gbps"] for r in summary["results"])


def test_message_sizes_double_up_to_the_largest_and_refuse_an_empty_range():
    assert message_sizes(8) == [MB, 2 * MB, 4 * MB, 8 * MB]
    with pytest.raises(ValueError, match="below --min-mb"):
        message_sizes(0)


def test_a_host_gets_its_best_link():
    hosts = result_with([100, 100, 100], [1.0, 0.2, 0.9])["hosts"]  # links 0-1, 1-2, 2-0

    assert [h["link_gbps"] for h in hosts] == [1.0, 1.0, 0.9]


def test_healthy_hosts_name_no_one():
    assert slowest_host(result_with([120, 150, 100, 130], [1.4, 1.2, 1.3, 1.5])) is None


def test_a_host_whose_both_links_are_slow_is_named_on_a_ring():
    slow = slowest_host(result_with([120, 118, 121], [0.4, 0.45, 1.3]))  # host 1: links 0-1 and 1-2

    assert slow["rank"] == 1 and slow["node_ip"] == "127.0.0.3" and slow["metric"] == "link_gbps"
    assert slow["ratio"] == pytest.approx(0.45 / 1.3)


def test_with_two_nodes_the_shared_link_names_no_one_but_the_local_test_does():
    assert slowest_host(result_with([120, 118], [0.2])) is None
    slow = slowest_host(result_with([120, 20], [0.2]))
    assert slow["rank"] == 1 and slow["metric"] == "local_gbps" and slow["what"] == "local memory bandwidth"


def test_the_fraction_sets_how_far_behind_a_host_must_be():
    result = result_with([100, 60, 100], [1.0, 1.0, 1.0])

    assert slowest_host(result, fraction=0.5) is None
    assert slowest_host(result, fraction=0.7)["rank"] == 1


def test_a_result_without_per_host_figures_names_no_one():
    assert slowest_host({"nodes": 3, "results": []}) is None


def test_probe_sizes_follow_the_predicted_bandwidth_and_the_budget():
    from clusters.probes.allreduce import MIN_MESSAGE_BYTES, budget_plan

    block = budget_plan(0.1, 12.0, 2, iters=10, warmup=2, max_bytes=256 * MB)
    site = budget_plan(0.003125, 12.0, 2, iters=10, warmup=2, max_bytes=256 * MB)
    datacenter = budget_plan(400.0, 12.0, 2, iters=10, warmup=2, max_bytes=256 * MB)

    assert site.sizes[-1] < block.sizes[-1] < datacenter.sizes[-1] == 256 * MB
    for plan, busbw in ((block, 0.1e9), (site, 0.003125e9)):
        sweep_s = sum(12 * size / busbw for size in plan.sizes)
        assert sweep_s <= 0.6 * 12.0  # the sweep's share of the budget, at the predicted rate
        assert plan.link_bytes / busbw <= 0.05 or plan.link_bytes == MIN_MESSAGE_BYTES
    assert all(size >= MIN_MESSAGE_BYTES and size & (size - 1) == 0 for size in site.sizes)
    assert budget_plan(None, 12.0, 2, 10, 2, 8 * MB).sizes[-1] == 8 * MB  # no prediction: the cap


def test_link_groups_run_disjoint_ring_links_together():
    from clusters.probes.allreduce import link_groups

    assert link_groups(ring_links(2)) == [[(0, 1)]]
    assert link_groups(ring_links(4)) == [[(0, 1), (2, 3)], [(1, 2), (3, 0)]]
    assert link_groups(ring_links(5)) == [[(0, 1), (2, 3)], [(1, 2), (3, 4)], [(4, 0)]]
    for world in range(2, 9):
        groups = link_groups(ring_links(world))
        assert sorted(pair for group in groups for pair in group) == sorted(ring_links(world))
        for group in groups:
            hosts = [host for pair in group for host in pair]
            assert len(hosts) == len(set(hosts))


def test_a_sweep_cut_short_reports_only_the_sizes_that_ran():
    result = summarize(2, "gloo", [MB, 2 * MB, 4 * MB], [[0.01, 0.02], [0.011, 0.021]])

    assert [r["bytes"] for r in result["results"]] == [MB, 2 * MB]


def test_the_measurement_gets_what_the_probes_start_up_left_of_the_budget(monkeypatch):
    from clusters.probes import allreduce

    finish, overhead = allreduce._FINISH_S, allreduce._WINDOW_OVERHEAD_S
    monkeypatch.setattr(allreduce.time, "time", lambda: 1000.0)
    # 5 s of start-up (launch, `import torch`, rendezvous) of a 12 s budget: 7 s less the finish are left
    # to measure; the host windows keep their 0.2 s (a throttled host shows only over a window longer
    # than its cgroup's 100 ms period), the sweep gets the rest.
    sweep, window, spent = allreduce.measure_budget(12.0, 995.0, windows=6, host_window_s=0.2)
    assert spent == 5.0 and window == 0.2
    assert sweep + 6 * (window + overhead) == pytest.approx(7.0 - finish)
    # Without the submission time the budget covers the measurement only (as before).
    assert allreduce.measure_budget(12.0, None, 6, 0.2) == (12.0 * 0.6, 0.2, None)
    # A start-up past the budget (or a skewed clock) counts half the budget at most: the measurement
    # always keeps the rest (a probe that measures nothing would say nothing).
    sweep, window, spent = allreduce.measure_budget(12.0, 900.0, 6, 0.2)
    assert spent == 6.0 and sweep == pytest.approx(12.0 - 6.0 - finish - 6 * (0.2 + overhead))
    assert window == 0.2
    assert allreduce.measure_budget(12.0, 2000.0, 6, 0.2)[2] == 0.0


def test_a_local_window_is_measured_in_time_so_a_throttled_host_cannot_hide(monkeypatch):
    """Seen after the probe left Ray: a throttled host's (20% CPU quota) window, sized in steps from a
    timed step, sometimes came out at a few steps that fitted in one quota slice, and the host passed as
    healthy. A window of wall time spans the quota's periods whatever one step costs."""
    from clusters.probes import allreduce

    clock = [0.0]
    calls = []

    def throttled_step():  # 2 ms of work; every 10th step waits out the rest of a 100 ms period
        calls.append(1)
        clock[0] += 0.002 + (0.08 if len(calls) % 10 == 0 else 0.0)

    monkeypatch.setattr(allreduce.time, "perf_counter", lambda: clock[0])

    rate = allreduce._window_rate(throttled_step, 1_000_000, window_s=0.2, rounds=2)

    assert rate == pytest.approx(1_000_000 / 0.01 / 1e9, rel=0.1)  # 10 steps per 100 ms: 0.1 GB/s, not 0.5


def test_a_link_window_is_sized_once_and_reused_by_the_next_rounds(monkeypatch):
    """Both sides of a link must run the same number of steps: the first round sizes the window from the
    fastest of three timed steps, later rounds reuse it (no warm-up, no sizing: a slow link's steps are
    the probe's most expensive)."""
    from clusters.probes import allreduce

    clock = [0.0]
    durations = iter([0.001, 0.08, 0.002, 0.002] + [0.002] * 1000)  # warm-up, a stalled step, then steady
    calls = []

    def step():
        calls.append(1)
        clock[0] += next(durations)

    monkeypatch.setattr(allreduce.time, "perf_counter", lambda: clock[0])

    rate, count = allreduce._best_rate(step, 1_000_000, window_s=0.2, rounds=1)

    assert len(calls) == 1 + 3 + 100 and count == 100  # warm-up, three sizing steps, 0.2 s / 2 ms
    assert rate == pytest.approx(1_000_000 * 100 / 0.2 / 1e9)
    calls.clear()
    assert allreduce._best_rate(step, 1_000_000, 0.2, 1, count=count)[1] == 100 and len(calls) == 100
