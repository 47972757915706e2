"""Hardware discovery parsers against captures modelled on real machines' output (pure, no database)."""

from __future__ import annotations

from pathlib import Path

import pytest

from inventory.discovery.ibstat import parse_ibstat
from inventory.discovery.nvidia_smi import parse_query_gpu
from inventory.discovery.topo import parse_topo
from inventory.discovery.types import QUERY_FIELDS, GpuQuery, ParseError

CAPTURES = Path(__file__).parent / "captures"


def capture(name: str) -> str:
    return (CAPTURES / name).read_text(encoding="utf-8")


# ---------------------------------------------------------------------------- nvidia-smi --query-gpu


def test_dgx_h100_query_with_units_reads_eight_h100s():
    query = parse_query_gpu(capture("query_dgx_h100_units.csv"))

    assert [g.index for g in query.gpus] == list(range(8))
    assert {g.model for g in query.gpus} == {"H100-SXM"}
    first = query.gpus[0]
    assert first.name == "NVIDIA H100 80GB HBM3"
    assert first.uuid == "GPU-6f3b1c2e-9a4d-8e1f-2b7c-5d0a9e3f4c21"
    assert first.memory_total_mib == 81559
    assert first.pci_bus_id == "00000000:18:00.0"
    assert (first.temperature_c, first.utilization_pct, first.memory_used_mib) == (33, 0, 1)
    assert first.ecc_uncorrectable == 0
    assert first.power_draw_w == pytest.approx(69.47)
    assert query.lost == ()


def test_a100_query_without_units_gives_same_numbers():
    query = parse_query_gpu(capture("query_dgx_a100_nounits.csv"))

    assert len(query.gpus) == 8
    assert {g.model for g in query.gpus} == {"A100-80GB"}
    assert query.gpus[3].name == "NVIDIA A100-SXM4-80GB"
    assert query.gpus[3].memory_total_mib == 81920
    assert query.gpus[3].memory_used_mib == 4
    assert query.gpus[3].power_draw_w == pytest.approx(62.05)


def test_query_without_header_uses_query_fields_order():
    query = parse_query_gpu(capture("query_l40s_noheader.csv"))

    assert [g.model for g in query.gpus] == ["L40S"] * 4
    assert query.gpus[1].pci_bus_id == "00000000:61:00.0"
    assert query.gpus[1].memory_total_mib == 46068
    assert query.gpus[2].power_draw_w is None  # "[Unknown Error]"


def test_query_without_header_or_units():
    query = parse_query_gpu(capture("query_h200_noheader_nounits.csv"))

    assert len(query.gpus) == 8
    assert {g.model for g in query.gpus} == {"H200"}
    assert query.gpus[7].memory_total_mib == 143771
    assert query.gpus[7].temperature_c == 33


def test_consumer_gpus_report_none_for_unsupported_counters():
    query = parse_query_gpu(capture("query_rtx4090_na.csv"))

    first, second = query.gpus
    assert (first.model, second.model) == ("RTX 4090", "RTX 4090")
    assert first.ecc_uncorrectable is None and second.ecc_uncorrectable is None  # [N/A]
    assert first.utilization_pct == 3
    assert second.utilization_pct is None  # N/A
    assert second.power_draw_w is None  # [Not Supported]
    assert second.name == "NVIDIA GeForce RTX 4090"  # padding around the name stripped
    assert second.uuid == "GPU-0f6b8e24-c1a9-73d5-e8f0-b4a2c7d9e106"


def test_header_in_another_order_is_followed():
    query = parse_query_gpu(capture("query_reordered_header.csv"))

    busy = query.gpus[1]
    assert busy.index == 1
    assert busy.uuid == "GPU-0d8e2a71-4c3b-51f6-a9e8-7b2c6d1f0e93"
    assert (busy.memory_used_mib, busy.memory_total_mib) == (40127, 81559)
    assert (busy.utilization_pct, busy.temperature_c) == (97, 64)
    assert busy.power_draw_w == pytest.approx(512.30)


def test_header_with_a_subset_of_fields_leaves_the_rest_none():
    query = parse_query_gpu("index, name, uuid\n0, NVIDIA L40S, GPU-1234\n")

    assert query.gpus[0].model == "L40S"
    assert query.gpus[0].memory_total_mib is None


def test_lost_gpu_is_reported_beside_the_ones_that_answered():
    query = parse_query_gpu(capture("query_gpu_lost.csv"))

    assert [g.index for g in query.gpus] == [0, 1, 2, 4, 5, 6, 7]
    assert query.lost == ("Unable to determine the device handle for GPU0000:5D:00.0: Unknown Error",)
    assert query.gpus[-1].ecc_uncorrectable == 2


def test_lost_line_between_rows_without_header():
    text = (
        "0, GPU-a, NVIDIA H100 80GB HBM3, 81559 MiB, 00000000:18:00.0, 33, 0 %, 1 MiB, 0, 69.47 W\n"
        "Unable to determine the device handle for GPU0000:2A:00.0: Unknown Error\n"
    )
    query = parse_query_gpu(text)

    assert len(query.gpus) == 1 and len(query.lost) == 1


def test_single_gpu_host():
    query = parse_query_gpu(capture("query_single_gpu.csv"))

    assert len(query.gpus) == 1
    assert query.gpus[0].model == "H100-PCIe"
    assert query.gpus[0].name == "NVIDIA H100 PCIe"


@pytest.mark.parametrize("text", ["", "\n\n", capture("query_no_devices.txt")])
def test_no_output_means_no_gpus(text):
    assert parse_query_gpu(text) == GpuQuery(gpus=(), lost=())


def test_driver_mismatch_message_is_a_parse_error_naming_the_line():
    with pytest.raises(
        ParseError, match=r"line 1: 'Failed to initialize NVML: Driver/library version mismatch'"
    ):
        parse_query_gpu(capture("query_driver_mismatch.txt"))


def test_binary_garbage_after_header_is_a_parse_error_naming_line_two():
    with pytest.raises(ParseError, match=r"expected 10 comma-separated values .* saw 1 in line 2: '\\x7fELF"):
        parse_query_gpu(capture("query_garbage.txt"))


def test_wrong_column_count_names_the_row():
    text = capture("query_dgx_h100_units.csv").replace(", 68.52 W\n", "\n")

    with pytest.raises(ParseError, match=r"saw 9 in line 3: '1, GPU-0d8e2a71"):
        parse_query_gpu(text)


def test_non_numeric_index_is_refused():
    text = "x, GPU-a, NVIDIA H100 80GB HBM3, 81559 MiB, 00000000:18:00.0, 33, 0 %, 1 MiB, 0, 69.47 W\n"

    with pytest.raises(ParseError, match=r"expected a number for index, saw 'x' in line 1"):
        parse_query_gpu(text)


def test_non_numeric_memory_is_refused():
    text = "0, GPU-a, NVIDIA H100 80GB HBM3, lots, 00000000:18:00.0, 33, 0 %, 1 MiB, 0, 69.47 W\n"

    with pytest.raises(ParseError, match=r"expected a number for memory.total, saw 'lots'"):
        parse_query_gpu(text)


def test_header_without_index_is_refused():
    with pytest.raises(ParseError, match=r"index missing in line 1"):
        parse_query_gpu("uuid, name\nGPU-a, NVIDIA L40S\n")


def test_duplicate_index_is_refused():
    row = "0, GPU-a, NVIDIA L40S, 46068 MiB, 00000000:4A:00.0, 26, 0 %, 0 MiB, 0, 33.61 W\n"

    with pytest.raises(ParseError, match="index 0 twice"):
        parse_query_gpu(row + row)


def test_every_query_field_is_parsed():
    header = ", ".join(QUERY_FIELDS)
    row = "0, GPU-a, NVIDIA L40S, 46068, 00000000:4A:00.0, 26, 5, 7, 1, 33.5"

    gpu = parse_query_gpu(f"{header}\n{row}\n").gpus[0]

    assert None not in vars(gpu).values()


# --------------------------------------------------------------------------------------- topo -m


def test_dgx_h100_topology_is_one_nvlink_domain_with_eight_nics():
    topo = parse_topo(capture("topo_dgx_h100.txt"))

    assert topo.gpus == tuple(f"GPU{i}" for i in range(8))
    assert topo.nvlink_domains() == [list(range(8))]
    assert topo.links[("GPU0", "GPU7")] == "NV18"
    assert topo.nics == tuple(f"NIC{i}" for i in range(8))
    assert topo.nic_names["NIC0"] == "mlx5_0"
    assert topo.nic_names["NIC5"] == "mlx5_9"
    assert topo.links[("GPU5", "NIC5")] == "PIX"
    assert topo.links[("NIC5", "GPU0")] == "SYS"
    assert topo.cpu_affinity["GPU4"] == "56-111,168-223"
    assert topo.numa_affinity["GPU4"] == "1"
    assert topo.gpu_numa_id["GPU4"] == "N/A"


def test_older_driver_names_nics_directly_and_has_no_gpu_numa_id():
    topo = parse_topo(capture("topo_dgx_a100_driver470.txt"))

    assert topo.nvlink_domains() == [list(range(8))]
    assert topo.links[("GPU3", "GPU4")] == "NV12"
    assert topo.nics == tuple(f"mlx5_{i}" for i in range(8))
    assert topo.nic_names["mlx5_2"] == "mlx5_2"
    assert topo.links[("GPU2", "mlx5_2")] == "PXB"
    assert topo.numa_affinity["GPU0"] == "3"
    assert topo.cpu_affinity["GPU0"] == "48-63,176-191"
    assert topo.gpu_numa_id == {}


def test_pcie_l40s_host_has_one_domain_per_gpu():
    topo = parse_topo(capture("topo_l40s_pcie.txt"))

    assert topo.nvlink_domains() == [[0], [1], [2], [3]]
    assert topo.links[("GPU0", "GPU1")] == "NODE"
    assert topo.links[("GPU0", "GPU2")] == "SYS"
    assert topo.nic_names == {"NIC0": "mlx5_0", "NIC1": "mlx5_1"}
    assert "NIC0" not in topo.cpu_affinity


def test_matrix_without_cpu_affinity_column_still_parses():
    topo = parse_topo(capture("topo_l40s_no_affinity.txt"))

    assert topo.gpus == ("GPU0", "GPU1", "GPU2", "GPU3")
    assert topo.nvlink_domains() == [[0], [1], [2], [3]]
    assert topo.links[("GPU3", "NIC1")] == "NODE"
    assert topo.nic_names == {"NIC0": "mlx5_0", "NIC1": "mlx5_1"}
    assert topo.cpu_affinity == {} and topo.numa_affinity == {}


def test_each_nic_knows_its_closest_gpus():
    topo = parse_topo(capture("topo_l40s_pcie.txt"))

    assert topo.closest_gpus("NIC0") == ("PXB", (0,))
    assert topo.closest_gpus("NIC1") == ("PXB", (2,))
    h100 = parse_topo(capture("topo_dgx_h100.txt"))
    assert h100.closest_gpus("NIC5") == ("PIX", (5,))


def test_two_consumer_gpus_are_two_domains():
    topo = parse_topo(capture("topo_rtx4090_x2.txt"))

    assert topo.nvlink_domains() == [[0], [1]]
    assert topo.links[("GPU1", "GPU0")] == "PHB"
    assert topo.nics == ()


def test_single_gpu_host_topology():
    topo = parse_topo(capture("topo_single_gpu.txt"))

    assert topo.gpus == ("GPU0",)
    assert topo.nvlink_domains() == [[0]]
    assert topo.links == {}
    assert topo.cpu_affinity == {"GPU0": "0-25"}


def test_nvlink_bridged_pairs_form_two_domains():
    topo = parse_topo(capture("topo_a100_pcie_bridged_pairs.txt"))

    assert topo.nvlink_domains() == [[0, 1], [2, 3]]


def test_space_separated_matrix_parses_like_tabs():
    topo = parse_topo(capture("topo_h200_spaces.txt"))

    assert topo.nvlink_domains() == [list(range(8))]
    assert topo.nic_names == {"NIC0": "mlx5_0", "NIC1": "mlx5_1"}
    assert topo.links[("GPU6", "NIC1")] == "NODE"
    assert topo.numa_affinity["GPU6"] == "1"


def test_ansi_underlined_header_is_accepted():
    text = (
        "\x1b[4m\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\x1b[0m\n"
        "GPU0\t X \tNV4\t0-7\t0\n"
        "GPU1\tNV4\t X \t0-7\t0\n"
    )

    assert parse_topo(text).nvlink_domains() == [[0, 1]]


def test_topo_garbage_is_a_parse_error_naming_the_first_line():
    with pytest.raises(ParseError, match=r"expected the header row .* line 1: 'NVRM: API mismatch"):
        parse_topo(capture("topo_garbage.txt"))


def test_empty_topo_output_is_a_parse_error():
    with pytest.raises(ParseError, match="empty output"):
        parse_topo("")


def test_unknown_cell_names_the_row():
    text = capture("topo_rtx4090_x2.txt").replace("GPU1\tPHB", "GPU1\tWAT")

    with pytest.raises(ParseError, match=r"line 3: 'GPU1\\tWAT"):
        parse_topo(text)


def test_truncated_matrix_is_refused():
    text = "\n".join(capture("topo_dgx_h100.txt").splitlines()[:5])

    with pytest.raises(ParseError, match="GPU4 GPU5 GPU6 GPU7 missing"):
        parse_topo(text)


# ---------------------------------------------------------------------------------------- ibstat


def test_ibstat_reads_every_port_of_every_ca():
    ports = parse_ibstat(capture("ibstat_ndr_hdr_roce.txt"))

    assert [(p.ca, p.port) for p in ports] == [
        ("mlx5_0", 1),
        ("mlx5_1", 1),
        ("mlx5_2", 1),
        ("mlx5_3", 1),
        ("mlx5_3", 2),
        ("mlx5_4", 1),
        ("mlx5_5", 1),
    ]


def test_ibstat_rates_and_link_layers():
    ports = {(p.ca, p.port): p for p in parse_ibstat(capture("ibstat_ndr_hdr_roce.txt"))}

    assert ports[("mlx5_0", 1)].rate_gbps == 400 and ports[("mlx5_0", 1)].link_layer == "InfiniBand"
    assert ports[("mlx5_2", 1)].rate_gbps == 200  # HDR
    assert ports[("mlx5_3", 1)].link_layer == "Ethernet"  # RoCE
    assert ports[("mlx5_3", 1)].rate_gbps == 100


def test_ibstat_tells_up_ports_from_down_ones():
    ports = {(p.ca, p.port): p for p in parse_ibstat(capture("ibstat_ndr_hdr_roce.txt"))}

    assert ports[("mlx5_0", 1)].is_up
    assert not ports[("mlx5_3", 2)].is_up and ports[("mlx5_3", 2)].physical_state == "Disabled"
    assert ports[("mlx5_4", 1)].state == "Down" and ports[("mlx5_4", 1)].physical_state == "Polling"
    assert ports[("mlx5_5", 1)].state == "Initializing" and not ports[("mlx5_5", 1)].is_up


def test_ibstat_empty_output_is_no_ports():
    assert parse_ibstat("") == ()
    assert parse_ibstat("\n") == ()


def test_ibstat_error_output_is_a_parse_error_naming_the_line():
    with pytest.raises(ParseError, match=r"line 1: .ibwarn: \[41822\] umad_init"):
        parse_ibstat(capture("ibstat_garbage.txt"))


def test_ibstat_port_without_rate_is_refused():
    text = capture("ibstat_ndr_hdr_roce.txt").replace("\t\tRate: 200\n", "")

    with pytest.raises(ParseError, match="mlx5_2 port 1 .*Rate missing"):
        parse_ibstat(text)
