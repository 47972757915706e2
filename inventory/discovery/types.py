"""What hardware discovery returns. Pure Python: no Django import (parsers are unit-tested alone)."""

from __future__ import annotations

from dataclasses import dataclass, field

# The columns Volt asks nvidia-smi for, in this order:
#   nvidia-smi --query-gpu=<QUERY_FIELDS> --format=csv
QUERY_FIELDS = (
    "index",
    "uuid",
    "name",
    "memory.total",
    "pci.bus_id",
    "temperature.gpu",
    "utilization.gpu",
    "memory.used",
    "ecc.errors.uncorrected.volatile.total",
    "power.draw",
)


# `topo -m` link classes between a NIC and a GPU, nearest first.
PCIE_LINK_ORDER = ("PIX", "PXB", "PHB", "NODE", "SYS", "SOC")


class ParseError(ValueError):
    """Output that cannot be understood. The message says what was expected and what was seen."""


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str  # as printed, e.g. "NVIDIA H100 80GB HBM3"
    model: str  # Volt's precise model: "H100-SXM", "A100-40GB", "L40S" (or the normalised name if unknown)
    memory_total_mib: int | None = None
    pci_bus_id: str | None = None
    temperature_c: int | None = None
    utilization_pct: int | None = None
    memory_used_mib: int | None = None
    ecc_uncorrectable: int | None = None  # None where not supported (consumer GPUs)
    power_draw_w: float | None = None


@dataclass(frozen=True)
class GpuQuery:
    """`nvidia-smi --query-gpu`: the GPUs that answered, and the messages of those that did not.

    `lost` holds lines such as "Unable to determine the device handle for GPU0000:1B:00.0: Unknown
    Error" (a GPU fallen off the bus): the host has more GPUs than `gpus` lists.
    """

    gpus: tuple[GpuInfo, ...] = ()
    lost: tuple[str, ...] = ()


@dataclass(frozen=True)
class TopoMatrix:
    """`nvidia-smi topo -m`: the connection between each pair of devices."""

    gpus: tuple[str, ...]  # ("GPU0", "GPU1", ...)
    nics: tuple[str, ...] = ()  # ("NIC0", ...)
    nic_names: dict[str, str] = field(default_factory=dict)  # NIC0 -> mlx5_0, from the legend
    links: dict[tuple[str, str], str] = field(default_factory=dict)  # (GPU0, GPU1) -> "NV18" / "SYS" / ...
    cpu_affinity: dict[str, str] = field(default_factory=dict)
    numa_affinity: dict[str, str] = field(default_factory=dict)
    gpu_numa_id: dict[str, str] = field(default_factory=dict)  # newer drivers; "N/A" for discrete GPUs

    def closest_gpus(self, nic: str) -> tuple[str, tuple[int, ...]]:
        """(link, GPU indices) of the GPUs nearest to `nic` ("NIC0" or "mlx5_0"): ("PIX", (5,)).

        Nearest is the best PCIe link class printed between the NIC and any GPU; ("", ()) if none.
        """
        best: tuple[int, str, list[int]] = (len(PCIE_LINK_ORDER), "", [])
        for gpu in self.gpus:
            link = self.links.get((nic, gpu)) or self.links.get((gpu, nic), "")
            rank = PCIE_LINK_ORDER.index(link) if link in PCIE_LINK_ORDER else len(PCIE_LINK_ORDER)
            if rank < best[0]:
                best = (rank, link, [int(gpu[3:])])
            elif rank == best[0] and rank < len(PCIE_LINK_ORDER):
                best[2].append(int(gpu[3:]))
        return best[1], tuple(sorted(best[2]))

    def nvlink_domains(self) -> list[list[int]]:
        """GPU indices grouped by NVLink connectivity (connected components over NV# links).

        A GPU with no NVLink to any other is a domain of its own (consumer GPUs, PCIe-only hosts).
        """
        indices = [int(g[3:]) for g in self.gpus]
        parent = {i: i for i in indices}

        def find(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        for (a, b), kind in self.links.items():
            if a.startswith("GPU") and b.startswith("GPU") and a != b and kind.startswith("NV"):
                ra, rb = find(int(a[3:])), find(int(b[3:]))
                if ra != rb:
                    parent[max(ra, rb)] = min(ra, rb)
        groups: dict[int, list[int]] = {}
        for i in indices:
            groups.setdefault(find(i), []).append(i)
        return sorted(sorted(g) for g in groups.values())

    def pcie_groups(self) -> tuple[list[list[int]], list[list[int]]]:
        """(GPUs under one PCIe switch, GPUs on one NUMA node): connected components over GPU pairs
        linked by PIX/PXB, and by PIX/PXB/PHB/NODE (everything but SYS). Placement uses them on
        hosts without NVLink: a node prefers one switch, then one NUMA node."""
        return self._components({"PIX", "PXB"}), self._components({"PIX", "PXB", "PHB", "NODE"})

    def _components(self, kinds: set[str]) -> list[list[int]]:
        indices = [int(g[3:]) for g in self.gpus]
        group = {i: {i} for i in indices}
        for (a, b), kind in self.links.items():
            if a.startswith("GPU") and b.startswith("GPU") and a != b and kind in kinds:
                merged = group[int(a[3:])] | group[int(b[3:])]
                for i in merged:
                    group[i] = merged
        return [list(g) for g in sorted({tuple(sorted(g)) for g in group.values()})]


@dataclass(frozen=True)
class IbPort:
    ca: str  # "mlx5_0"
    port: int
    state: str  # "Active", "Down", ...
    physical_state: str  # "LinkUp", "Disabled", ...
    rate_gbps: int  # signalling rate as printed by ibstat ("Rate: 400") in Gb/s
    link_layer: str  # "InfiniBand" or "Ethernet"
    roce: bool | None = None  # Ethernet ports: RoCE GIDs present (sysfs); None where not known
    source: str = "ibstat"  # or "sysfs"

    @property
    def is_up(self) -> bool:
        return self.state == "Active" and self.physical_state == "LinkUp"

    @property
    def transport(self) -> str:
        """ "infiniband", "roce" or "ethernet" (an Ethernet port whose RDMA is not confirmed)."""
        if self.link_layer.lower() == "infiniband":
            return "infiniband"
        return "roce" if self.roce else "ethernet"
