"""The `local` hosts' simulated nvidia-smi / ibstat, run as the driver runs them, read by the real parsers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from inventory.discovery.ibstat import parse_ibstat
from inventory.discovery.nvidia_smi import parse_query_gpu
from inventory.discovery.topo import parse_topo
from inventory.discovery.types import QUERY_FIELDS, ParseError

REPO_ROOT = Path(__file__).resolve().parents[2]
QUERY = [f"--query-gpu={','.join(QUERY_FIELDS)}", "--format=csv"]
H100_HOST = {
    "gpu_model": "H100",
    "gpu_count": 8,
    "nics": [{"name": f"mlx5_{i}", "link_layer": "InfiniBand", "rate_gbps": 400} for i in range(8)],
    "driver_version": "550.54.15",
    "cuda_version": "12.4",
    "seed": "iad1-h100-01",
}
A100_HOST = {"gpu_model": "A100", "gpu_count": 8, "seed": "ord2-a100-07"}
RTX_HOST = {"gpu_model": "RTX 4090", "gpu_count": 2, "seed": "home-lab-1"}


def make_host(root: Path, spec: dict, **faults: str) -> Path:
    (root / "faults").mkdir(parents=True, exist_ok=True)
    (root / "spec.json").write_text(json.dumps(spec))
    for name, content in faults.items():
        (root / "faults" / name).write_text(content)
    return root


def run(root: Path, tool: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "VOLT_HOST_ROOT": str(root), "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "inventory.drivers.simulator", tool, *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


def query(root: Path, *args: str):
    return parse_query_gpu(run(root, "nvidia-smi", *(args or QUERY)).stdout)


# ------------------------------------------------------------------------------------ healthy hosts


def test_h100_host_reports_eight_h100s(tmp_path):
    host = make_host(tmp_path, H100_HOST)

    result = run(host, "nvidia-smi", *QUERY)
    gpus = parse_query_gpu(result.stdout).gpus

    assert result.returncode == 0
    assert [g.index for g in gpus] == list(range(8))
    assert {g.model for g in gpus} == {"H100-SXM"}
    assert {g.memory_total_mib for g in gpus} == {81559}
    assert len({g.uuid for g in gpus}) == 8
    assert all(g.ecc_uncorrectable == 0 and g.temperature_c < 50 for g in gpus)
    assert result.stdout.splitlines()[0].startswith("index, uuid, name, memory.total [MiB], pci.bus_id")


def test_h100_host_topology_is_one_nvlink_domain_with_its_nics(tmp_path):
    host = make_host(tmp_path, H100_HOST)

    topo = parse_topo(run(host, "nvidia-smi", "topo", "-m").stdout)

    assert topo.nvlink_domains() == [list(range(8))]
    assert topo.links[("GPU0", "GPU5")] == "NV18"
    assert sorted(topo.nic_names.values()) == sorted(f"mlx5_{i}" for i in range(8))
    assert set(topo.numa_affinity.values()) == {"0", "1"}


def test_h100_host_ibstat_lists_one_active_ndr_port_per_nic(tmp_path):
    host = make_host(tmp_path, H100_HOST)

    ports = parse_ibstat(run(host, "ibstat").stdout)

    assert [p.ca for p in ports] == [f"mlx5_{i}" for i in range(8)]
    assert all(p.is_up and p.rate_gbps == 400 and p.link_layer == "InfiniBand" for p in ports)


def test_list_gpus_and_summary_agree_with_query(tmp_path):
    host = make_host(tmp_path, H100_HOST)
    uuids = [g.uuid for g in query(host).gpus]

    listing = run(host, "nvidia-smi", "-L").stdout.splitlines()
    summary = run(host, "nvidia-smi").stdout

    assert listing[0] == f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {uuids[0]})"
    assert len(listing) == 8
    assert "Driver Version: 550.54.15" in summary and "CUDA Version: 12.4" in summary
    assert summary.count("NVIDIA H100 80GB HBM3") == 8


def test_uuids_are_stable_per_host_and_unique_across_hosts(tmp_path):
    first = make_host(tmp_path / "a", H100_HOST)
    second = make_host(tmp_path / "b", {**H100_HOST, "seed": "iad1-h100-02"})

    again = [g.uuid for g in query(first).gpus]

    assert again == [g.uuid for g in query(first).gpus]
    assert not set(again) & {g.uuid for g in query(second).gpus}
    assert all(len(uuid) == 40 and uuid.startswith("GPU-") for uuid in again)


def test_a100_host_reports_a100s_over_nv12(tmp_path):
    host = make_host(tmp_path, A100_HOST)

    gpus = query(host).gpus
    topo = parse_topo(run(host, "nvidia-smi", "topo", "-m").stdout)

    assert {g.model for g in gpus} == {"A100-80GB"} and len(gpus) == 8
    assert topo.nvlink_domains() == [list(range(8))]
    assert topo.links[("GPU1", "GPU2")] == "NV12"


def test_consumer_host_has_no_ecc_and_no_nvlink(tmp_path):
    host = make_host(tmp_path, RTX_HOST)

    gpus = query(host).gpus
    topo = parse_topo(run(host, "nvidia-smi", "topo", "-m").stdout)

    assert [g.model for g in gpus] == ["RTX 4090", "RTX 4090"]
    assert [g.ecc_uncorrectable for g in gpus] == [None, None]
    assert topo.nvlink_domains() == [[0], [1]]
    assert parse_ibstat(run(host, "ibstat").stdout) == ()


def test_pcie_host_with_roce_and_a_down_nic(tmp_path):
    nics = [
        {"name": "mlx5_0", "link_layer": "Ethernet", "rate_gbps": 100},
        {"name": "mlx5_1", "link_layer": "Ethernet", "rate_gbps": 100, "state": "Down"},
    ]
    host = make_host(tmp_path, {"gpu_model": "L40S", "gpu_count": 4, "nics": nics})

    topo = parse_topo(run(host, "nvidia-smi", "topo", "-m").stdout)
    ports = parse_ibstat(run(host, "ibstat").stdout)

    assert topo.nvlink_domains() == [[0], [1], [2], [3]]
    assert topo.links[("GPU0", "GPU3")] == "SYS"
    assert [(p.link_layer, p.is_up) for p in ports] == [("Ethernet", True), ("Ethernet", False)]


@pytest.mark.parametrize("options", ["csv", "csv,noheader", "csv,nounits", "csv,noheader,nounits"])
def test_every_format_option_reads_the_same(tmp_path, options):
    host = make_host(tmp_path, A100_HOST)

    gpus = query(host, f"--query-gpu={','.join(QUERY_FIELDS)}", f"--format={options}").gpus

    assert gpus == query(host).gpus


def test_any_subset_and_order_of_fields(tmp_path):
    host = make_host(tmp_path, RTX_HOST)

    result = run(host, "nvidia-smi", "--query-gpu=memory.total,name,index,uuid", "--format=csv")

    assert result.stdout.splitlines()[0] == "memory.total [MiB], name, index, uuid"
    assert [g.memory_total_mib for g in parse_query_gpu(result.stdout).gpus] == [24564, 24564]


def test_unknown_field_is_refused_like_nvidia_smi(tmp_path):
    host = make_host(tmp_path, H100_HOST)

    result = run(host, "nvidia-smi", "--query-gpu=index,foo", "--format=csv")

    assert result.returncode == 2
    assert 'Field "foo" is not a valid field to query.' in result.stdout


def test_host_without_gpus_says_no_devices(tmp_path):
    host = make_host(tmp_path, {"gpu_count": 0})

    result = run(host, "nvidia-smi", *QUERY)

    assert result.returncode == 6
    assert parse_query_gpu(result.stdout).gpus == ()


def test_missing_spec_is_a_clear_error(tmp_path):
    result = run(tmp_path, "nvidia-smi", *QUERY)

    assert result.returncode == 2
    assert "spec.json" in result.stderr


# ------------------------------------------------------------------------------------------ faults


def test_lost_gpu_is_missing_and_reported(tmp_path):
    host = make_host(tmp_path, H100_HOST, gpu_lost="3")

    result = run(host, "nvidia-smi", *QUERY)
    parsed = parse_query_gpu(result.stdout)

    assert result.returncode != 0
    assert [g.index for g in parsed.gpus] == [0, 1, 2, 4, 5, 6, 7]
    assert parsed.lost == ("Unable to determine the device handle for GPU0000:5D:00.0: Unknown Error",)


def test_two_lost_gpus_leave_the_others_in_topology(tmp_path):
    host = make_host(tmp_path, H100_HOST, gpu_lost="1, 5")

    assert len(query(host).lost) == 2
    topo = parse_topo(run(host, "nvidia-smi", "topo", "-m").stdout)
    assert topo.nvlink_domains() == [[0, 2, 3, 4, 6, 7]]


def test_ecc_fault_marks_only_the_named_gpu(tmp_path):
    host = make_host(tmp_path, H100_HOST, ecc_uncorrectable="0")

    errors = [g.ecc_uncorrectable for g in query(host).gpus]

    assert errors[0] > 0
    assert errors[1:] == [0] * 7


def test_hot_fault_heats_the_named_gpus(tmp_path):
    host = make_host(tmp_path, A100_HOST, hot="2,6")

    temperatures = {g.index: g.temperature_c for g in query(host).gpus}

    assert temperatures[2] == temperatures[6] == 96
    assert max(t for i, t in temperatures.items() if i not in (2, 6)) < 50


def test_empty_fault_file_means_every_gpu(tmp_path):
    host = make_host(tmp_path, RTX_HOST, hot="")

    assert [g.temperature_c for g in query(host).gpus] == [96, 96]


@pytest.mark.parametrize(
    "args",
    [QUERY, ["--query-gpu=index,name", "--format=csv,noheader"], ["topo", "-m"]],
    ids=["query", "noheader-two-fields", "topo"],
)
def test_garbage_fault_exits_zero_but_does_not_parse(tmp_path, args):
    host = make_host(tmp_path, H100_HOST, nvidia_smi_garbage="")

    result = run(host, "nvidia-smi", *args)

    assert result.returncode == 0 and result.stdout.strip()
    parse = parse_topo if args[0] == "topo" else parse_query_gpu
    with pytest.raises(ParseError):
        parse(result.stdout)


@pytest.mark.parametrize(
    "args", [QUERY, ["topo", "-m"], ["-L"], []], ids=["query", "topo", "list", "summary"]
)
def test_driver_not_loaded_prints_nvidias_message_and_exits_9(tmp_path, args):
    host = make_host(tmp_path, H100_HOST, driver_not_loaded="")

    result = run(host, "nvidia-smi", *args)

    assert result.returncode == 9
    assert result.stdout.startswith(
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running."
    )


def test_faults_are_read_at_every_call(tmp_path):
    host = make_host(tmp_path, H100_HOST)
    assert len(query(host).gpus) == 8

    (host / "faults" / "gpu_lost").write_text("7")
    assert len(query(host).gpus) == 7

    (host / "faults" / "gpu_lost").unlink()
    assert len(query(host).gpus) == 8


def test_h100_nvl_host_pairs_its_gpus_over_nvlink_bridges(tmp_path):
    host = make_host(tmp_path, {"gpu_model": "H100-NVL", "gpu_count": 4, "seed": "nvl"})

    gpus = query(host).gpus
    topo = parse_topo(run(host, "nvidia-smi", "topo", "-m").stdout)

    assert {g.model for g in gpus} == {"H100-NVL"} and {g.memory_total_mib for g in gpus} == {95830}
    assert topo.nvlink_domains() == [[0, 1], [2, 3]]


def test_sysfs_tree_tells_roce_from_plain_ethernet(tmp_path):
    from inventory.discovery.network import SYSFS_COMMAND, parse_sysfs_ports
    from inventory.drivers.local import LocalDriver, create_sandbox

    nics = [
        {"name": "mlx5_0", "link_layer": "Ethernet", "rate_gbps": 200},
        {"name": "mlx5_1", "link_layer": "Ethernet", "rate_gbps": 100, "roce": False},
        {"name": "mlx5_2", "link_layer": "InfiniBand", "rate_gbps": 400, "state": "Down"},
    ]
    create_sandbox(tmp_path, {"gpu_model": "L40S", "gpu_count": 2, "nics": nics}, {"ibstat_missing": ""})
    driver = LocalDriver(tmp_path, "127.0.9.9")

    ports = parse_sysfs_ports(driver.run(SYSFS_COMMAND).stdout)

    assert [(p.ca, p.transport, p.rate_gbps, p.state) for p in ports] == [
        ("mlx5_0", "roce", 200, "Active"),
        ("mlx5_1", "ethernet", 100, "Active"),
        ("mlx5_2", "infiniband", 10, "Down"),
    ]
    assert not (tmp_path / "bin" / "ibstat").exists() and (tmp_path / "bin" / "nvidia-smi").exists()
