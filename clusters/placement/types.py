"""Frozen values that cross into and out of the placement engine. Pure Python: no Django import.

Units: every bandwidth in this package is in GB/s (gigabytes per second, the unit nccl-tests prints);
a `_gbps` suffix here means GB/s, never Gb/s. Prices are US dollars. Topology ids (site, fabric,
block) are unique inventory-wide (they are database keys), so a bare id names one domain.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Level(StrEnum):
    """Topology levels from finest to coarsest (DESIGN.md "Topology model"); GLOBAL spans regions."""

    BLOCK = "block"
    FABRIC = "fabric"
    SITE = "site"
    REGION = "region"
    GLOBAL = "global"


LEVELS: tuple[Level, ...] = tuple(Level)  # finest first: the order placement tries them


class FabricKind(StrEnum):
    """The interconnect technology of one fabric."""

    IB_NDR = "ib_ndr"
    IB_HDR = "ib_hdr"
    ROCE = "roce"
    ETH_100G = "eth_100g"
    ETH_25G = "eth_25g"
    ETH_10G = "eth_10g"


# A request may name fabric kinds or these categories; both expand to a set of kinds.
INTERCONNECT_CATEGORIES: dict[str, frozenset[str]] = {
    "infiniband": frozenset({FabricKind.IB_NDR, FabricKind.IB_HDR}),
    "roce": frozenset({FabricKind.ROCE}),
    "ethernet": frozenset({FabricKind.ETH_100G, FabricKind.ETH_25G, FabricKind.ETH_10G}),
}


class Parallelism(StrEnum):
    """How the workload uses its nodes; it decides what placement optimises."""

    DATA_PARALLEL = "data_parallel"  # DP / FSDP: all-reduce across every node
    TENSOR_PIPELINE = "tensor_pipeline"  # TP inside a node's NVLink domain, PP stages across nodes
    INFERENCE = "inference_replicas"  # independent replicas: no inter-node traffic
    INDEPENDENT = "independent"  # independent tasks: no interconnect, cheapest hosts


# Workloads whose nodes all-reduce: placement maximises predicted busbw before price.
COLLECTIVE: frozenset[str] = frozenset({Parallelism.DATA_PARALLEL, Parallelism.TENSOR_PIPELINE})


class ModelPolicy(StrEnum):
    """How a list of GPU models is read."""

    ANY_OF = "any_of"  # any listed model; the best plan across them wins
    ORDERED = "ordered"  # the first listed model that can be placed at all


class Constraint(StrEnum):
    """Strength of an interconnect or topology wish."""

    REQUIRED = "required"
    PREFERRED = "preferred"
    ANY = "any"


@dataclass(frozen=True, slots=True)
class TopologyPath:
    """Where a host sits: region -> site -> fabric -> block (leaf switch / rack)."""

    region: str
    site_id: str
    fabric_id: str
    block_id: str

    def domain(self, level: Level) -> tuple[str, ...]:
        """The key of this path's domain at `level` (a prefix of the path; () for GLOBAL)."""
        full = (self.region, self.site_id, self.fabric_id, self.block_id)
        return full[: 4 - LEVELS.index(level)]


@dataclass(frozen=True, slots=True)
class HostSnapshot:
    """One host as placement sees it at one moment: what is free, where it sits, what it costs."""

    host_id: str
    provider_id: str
    gpu_model: str
    free_gpus: tuple[tuple[int, ...], ...]  # free GPU indices, one tuple per NVLink domain
    total_gpus: int
    path: TopologyPath
    fabric_kind: str  # a FabricKind value
    fabric_host_gbps: float  # declared per-host injection bandwidth of the fabric, GB/s
    price_per_gpu_hour: float
    fabric_oversubscription: float = 1.0  # block uplink oversubscription (1.0 = non-blocking)
    site_backbone_gbps: float = 12.5  # declared bandwidth per host between the site's fabrics, GB/s
    reliability: float = 1.0  # 0..1, higher is better
    # False for PCIe-only hosts (no NVLink between GPUs: RTX 4090, L40S): a node may take any free GPUs
    # of the host, preferring one PCIe switch, then one NUMA node (`nvidia-smi topo -m`).
    nvlink: bool = True
    pcie_switches: tuple[tuple[int, ...], ...] = ()  # GPU indices under one PCIe switch (PIX/PXB)
    numa_nodes: tuple[tuple[int, ...], ...] = ()  # GPU indices on one NUMA node (NODE/PHB, not SYS)

    # Every declared figure of this host is multiplied by this: local hosts on an emulated fabric run at
    # VOLT_LOCAL_FABRIC_SCALE of their declared speeds (inventory/fabric_emulation.py), 1 elsewhere.
    bandwidth_scale: float = 1.0
    # What the host's ports give (count x rate of those up on its fabric's transport, GB/s), as discovery
    # found them; None where no port was seen. A host cannot inject more than its ports carry, whatever
    # its fabric declares: one 200 Gb/s port is 25 GB/s on a fabric declared at 200 GB/s per host.
    discovered_host_gbps: float | None = None

    def free_count(self) -> int:
        """Free GPUs on the host, whatever their domain."""
        return sum(len(domain) for domain in self.free_gpus)

    @property
    def injection_gbps(self) -> float:
        """The host's per-host injection bandwidth before scaling: the fabric's declared figure, or its
        ports' where they give less."""
        if self.discovered_host_gbps is None:
            return self.fabric_host_gbps
        return min(self.fabric_host_gbps, self.discovered_host_gbps)


@dataclass(frozen=True)
class PlacementRequest:
    """What a researcher asks for. `validate()` explains what is wrong with one, in user words."""

    nodes: int
    gpus_per_node: int
    models: tuple[str, ...]
    model_policy: str = ModelPolicy.ANY_OF
    interconnect: tuple[str, ...] = ()  # FabricKind values and/or INTERCONNECT_CATEGORIES keys
    interconnect_mode: str = Constraint.ANY
    topology_level: str | None = None  # a Level value
    topology_mode: str = Constraint.ANY  # required / preferred need a topology_level
    regions: tuple[str, ...] = ()  # empty: every region
    max_price_per_gpu_hour: float | None = None
    parallelism: str = Parallelism.DATA_PARALLEL
    pipeline_stages: int = 0  # tensor_pipeline only; 0 = one stage per node
    name: str = ""
    priority: int = 0
    reference_gradient_bytes: int = 14_000_000_000  # 7B parameters in bf16

    def interconnect_kinds(self) -> frozenset[str]:
        """The fabric kinds the `interconnect` names, categories expanded."""
        kinds: set[str] = set()
        for name in self.interconnect:
            kinds |= INTERCONNECT_CATEGORIES.get(name, {name})
        return frozenset(kinds)

    def is_collective(self) -> bool:
        """Whether the nodes all-reduce with each other (so bandwidth is worth paying for)."""
        return self.parallelism in COLLECTIVE and self.nodes > 1

    def problems(self) -> list[str]:
        """What is wrong with the request on its own (no inventory needed), in user words."""
        return [message for check in _REQUEST_CHECKS if (message := check(self))]


def _values(enum: type[StrEnum]) -> str:
    return ", ".join(member.value for member in enum)


def _check_counts(request: PlacementRequest) -> str:
    if request.nodes < 1 or request.gpus_per_node < 1:
        return f"nodes and GPUs per node must be at least 1 ({request.nodes} x {request.gpus_per_node} asked)"
    return ""


def _check_models(request: PlacementRequest) -> str:
    if not request.models:
        return "name at least one GPU model"
    if len(set(request.models)) != len(request.models):
        return f"GPU models are listed twice: {', '.join(request.models)}"
    if request.model_policy not in set(ModelPolicy):
        return f"model policy '{request.model_policy}' is not one of {_values(ModelPolicy)}"
    return ""


def _check_interconnect(request: PlacementRequest) -> str:
    if request.interconnect_mode not in set(Constraint):
        return f"interconnect '{request.interconnect_mode}' is not one of {_values(Constraint)}"
    unknown = [name for name in request.interconnect if name not in INTERCONNECT_CATEGORIES]
    unknown = [name for name in unknown if name not in set(FabricKind)]
    if unknown:
        known = ", ".join([*INTERCONNECT_CATEGORIES, *FabricKind])
        return f"unknown interconnect {', '.join(unknown)}; known: {known}"
    if request.interconnect_mode != Constraint.ANY and not request.interconnect:
        return f"interconnect is {request.interconnect_mode} but no fabric kind is named"
    return ""


def _check_topology(request: PlacementRequest) -> str:
    if request.topology_mode not in set(Constraint):
        return f"topology '{request.topology_mode}' is not one of {_values(Constraint)}"
    if request.topology_level is not None and request.topology_level not in set(Level):
        return f"topology level '{request.topology_level}' is not one of {_values(Level)}"
    if (request.topology_mode == Constraint.ANY) != (request.topology_level is None):
        return "a topology level needs a topology mode (required or preferred), and the reverse"
    return ""


def _check_price(request: PlacementRequest) -> str:
    price = request.max_price_per_gpu_hour
    if price is not None and price <= 0:
        return f"the maximum price per GPU-hour must be positive (${price} asked)"
    if request.reference_gradient_bytes <= 0:
        return "the reference gradient size must be positive"
    return ""


def _check_parallelism(request: PlacementRequest) -> str:
    if request.parallelism not in set(Parallelism):
        return f"parallelism '{request.parallelism}' is not one of {_values(Parallelism)}"
    stages = request.pipeline_stages
    if stages and request.parallelism != Parallelism.TENSOR_PIPELINE:
        return "pipeline stages only apply to tensor_pipeline parallelism"
    if stages < 0 or (stages and (stages > request.nodes or request.nodes % stages)):
        return f"{stages} pipeline stages cannot split {request.nodes} nodes evenly"
    return ""


_REQUEST_CHECKS = (
    _check_counts,
    _check_models,
    _check_interconnect,
    _check_topology,
    _check_price,
    _check_parallelism,
)


@dataclass(frozen=True, slots=True)
class NodeAssignment:
    """One node of a plan: a host and the GPU indices it gives (one NVLink domain on NVLink hosts)."""

    host_id: str
    gpu_indices: tuple[int, ...]


@dataclass(frozen=True)
class Plan:
    """Where a cluster goes, what it should reach, what it costs, and why it was chosen."""

    model: str
    nodes: tuple[NodeAssignment, ...]  # in pipeline stage order for tensor_pipeline
    head_host_id: str
    spanned_level: str  # coarsest level the hosts span (a Level value), or "host" for one node
    spanned_domain: tuple[str, ...]  # TopologyPath.domain key; () for "global", (host_id,) for "host"
    predicted_busbw_gbps: float | None  # inter-node all-reduce busbw, GB/s; None for one node
    predicted_allreduce_s: float | None  # ring all-reduce of the reference gradient; None for one node
    price_per_hour: float  # US dollars per hour for every GPU of the plan
    explanation: tuple[str, ...]
    stage_order: tuple[tuple[str, ...], ...] = ()  # tensor_pipeline: host ids per stage, in order
    # How the nodes reach each other (direct / overlay / relay: clusters/network_paths.py, outside the
    # engine, which knows topology, not reachability); with an overlay, `predicted_busbw_gbps` is the
    # direct figure times the overlay's measured cost and `direct_busbw_gbps` keeps the figure before it.
    network_path: str = "direct"
    direct_busbw_gbps: float | None = None

    @property
    def host_ids(self) -> tuple[str, ...]:
        """The hosts of the plan, in node order."""
        return tuple(node.host_id for node in self.nodes)


@dataclass(frozen=True)
class Refusal:
    """No plan fits now; `reasons` name the binding constraints with numbers. The request queues."""

    reasons: tuple[str, ...]
    explanation: tuple[str, ...] = ()  # levels and tiers the search tried


class InvalidRequest(ValueError):
    """The request itself is wrong (not a capacity problem); `problems` are user-facing messages."""

    def __init__(self, problems: list[str] | tuple[str, ...]):
        self.problems = tuple(problems)
        super().__init__("; ".join(self.problems))
