"""Issue 23, item 7: nccl-tests `all_reduce_perf` output as providers run it, parsed or refused naming the
line. Captures: 1 node x 8 H100 (one process, nGpus 8) and 2 nodes x 8 H100 (mpirun, one GPU per rank)."""

from pathlib import Path

import pytest

from inventory.discovery.nccl_tests import parse_all_reduce
from inventory.discovery.types import ParseError

CAPTURES = Path(__file__).parent / "captures"
ONE_NODE = (CAPTURES / "nccl_all_reduce_1x8_h100.txt").read_text()
TWO_NODES = (CAPTURES / "nccl_all_reduce_2x8_h100.txt").read_text()


def lines_of(text: str) -> list[str]:
    return text.splitlines()


def test_one_node_of_eight_gpus():
    run = parse_all_reduce(ONE_NODE)

    assert run.hostnames == ("dgx-h100-07",) and run.gpus_per_host == {"dgx-h100-07": 8}
    assert [rank.device for rank in run.ranks] == list(range(8))
    assert run.gpu_names == ("NVIDIA H100 80GB HBM3",)
    assert (run.min_bytes, run.max_bytes, len(run.rows)) == (8, 8589934592, 31)
    largest = run.largest
    assert (largest.size_bytes, largest.count, largest.dtype, largest.redop) == (
        8589934592,
        2147483648,
        "float",
        "sum",
    )
    assert (largest.out_of_place_busbw, largest.in_place_busbw) == (483.91, 478.46)
    assert run.busbw_gbps == 483.91  # the largest size, the better of out-of-place and in-place
    assert run.average_busbw_gbps == 169.562  # every size: kept, but not the figure


def test_two_nodes_of_eight_gpus():
    run = parse_all_reduce(TWO_NODES)

    assert run.hostnames == ("dgx-h100-07", "dgx-h100-08")
    assert run.gpus_per_host == {"dgx-h100-07": 8, "dgx-h100-08": 8}
    assert len(run.ranks) == 16 and run.busbw_gbps == 352.19
    assert run.rows[0].out_of_place_us == 58.79 and run.largest.out_of_place_algbw == 186.51


def test_nccl_log_lines_blank_lines_and_the_version_banner_are_accepted():
    lines = lines_of(TWO_NODES)
    noisy = [
        "# nccl-tests version 2.13.11 nccl-headers=22105 nccl-library=22105",
        "# Collective test starting: all_reduce_perf",
        *lines[:3],
        "dgx-h100-07:41877:41877 [0] NCCL INFO Bootstrap : Using ib0:10.0.0.7<0>",
        "",
        *lines[3:],
        "dgx-h100-08:39052:39110 [7] NCCL INFO comm 0x55d5 rank 15 nranks 16 - Destroy COMPLETE",
        "# Collective test concluded: all_reduce_perf",
    ]

    assert parse_all_reduce("\n".join(noisy)).busbw_gbps == 352.19


def test_output_cut_short_is_refused_naming_the_last_line():
    lines = lines_of(TWO_NODES)
    mid_row = "\n".join(lines[:30] + [lines[30][:60]])
    with pytest.raises(ParseError, match=r"line 31: '.*': expected a result row of 13 columns"):
        parse_all_reduce(mid_row)

    without_footer = "\n".join(lines[:-3])
    with pytest.raises(ParseError, match=r"ends at line 54: .*8589934592.* before '# Avg bus bandwidth'"):
        parse_all_reduce(without_footer)

    with pytest.raises(ParseError, match=r"ends at line 1 before the header"):
        parse_all_reduce("")


def test_unknown_output_is_refused_naming_the_line():
    with pytest.raises(ParseError, match=r"line 1: 'Hello from rank 0': expected all_reduce_perf's header"):
        parse_all_reduce("Hello from rank 0\n" + TWO_NODES)

    changed = TWO_NODES.replace(
        "#       size         count      type", "#       size         elems      type"
    )
    with pytest.raises(ParseError, match=r"line 22: .*expected the table's header line"):
        parse_all_reduce(changed)


def test_another_collective_is_refused():
    gather = ONE_NODE.replace("float     sum      -1", "float    none      -1", 1)
    with pytest.raises(ParseError, match=r"line 16: .*not an all-reduce row"):
        parse_all_reduce(gather)

    with pytest.raises(ParseError, match=r"this is all_gather_perf, not all_reduce_perf"):
        parse_all_reduce("# Collective test starting: all_gather_perf\n" + ONE_NODE)


def test_a_run_that_failed_its_check_is_refused():
    lines = lines_of(ONE_NODE)
    row = lines[40].split()
    row[8] = "3"
    wrong = "\n".join([*lines[:40], "  ".join(row), *lines[41:]])
    with pytest.raises(ParseError, match=r"line 41: .*3 wrong values"):
        parse_all_reduce(wrong)

    failed = ONE_NODE.replace("# Out of bounds values : 0 OK", "# Out of bounds values : 12 FAILED")
    with pytest.raises(ParseError, match=r"line 47: .*12 out-of-bounds values"):
        parse_all_reduce(failed)


def test_a_device_list_that_disagrees_with_the_table_is_refused():
    lines = lines_of(TWO_NODES)
    half = "\n".join([*lines[:11], *lines[19:]])  # ranks 8-15 dropped: 8 ranks, a 16-rank table
    with pytest.raises(ParseError, match=r"for the 8 ranks listed busbw is algbw x 1.75"):
        parse_all_reduce(half)


def test_a_row_missing_from_the_table_is_refused():
    lines = lines_of(TWO_NODES)
    cut = "\n".join([*lines[:35], *lines[36:]])
    with pytest.raises(
        ParseError, match=r"'# Avg bus bandwidth' says 114.565 GB/s but the table's busbw average"
    ):
        parse_all_reduce(cut)


def test_two_runs_in_one_upload_are_refused():
    with pytest.raises(ParseError, match=r"line 50: .*a second run begins"):
        parse_all_reduce(ONE_NODE + TWO_NODES)
