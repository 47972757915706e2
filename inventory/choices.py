"""Every status and kind of the inventory, with the sets code should use instead of literals."""

from django.db import models


class ProviderStatus(models.TextChoices):
    PENDING = "pending", "Pending approval"
    APPROVED = "approved", "Approved"
    SUSPENDED = "suspended", "Suspended"


class FabricKind(models.TextChoices):
    IB_NDR = "ib_ndr", "InfiniBand NDR"
    IB_HDR = "ib_hdr", "InfiniBand HDR"
    ROCE = "roce", "RoCE"
    ETH_100G = "eth_100g", "Ethernet 100G"
    ETH_25G = "eth_25g", "Ethernet 25G"
    ETH_10G = "eth_10g", "Ethernet 10G"


# Interconnect families a request can ask for ("InfiniBand preferred").
INTERCONNECT_FAMILIES = {
    "infiniband": {FabricKind.IB_NDR, FabricKind.IB_HDR},
    "roce": {FabricKind.ROCE},
    "ethernet": {FabricKind.ETH_100G, FabricKind.ETH_25G, FabricKind.ETH_10G},
}

# Default per-host injection bandwidth in GB/s when a fabric does not declare one
# (8 x 400 Gb/s NDR = 400 GB/s; 8 x 200 Gb/s HDR = 200 GB/s; RoCE 8 x 200 Gb/s = 200 GB/s; Ethernet: one NIC).
DEFAULT_HOST_BANDWIDTH_GBYTES = {
    FabricKind.IB_NDR: 400.0,
    FabricKind.IB_HDR: 200.0,
    FabricKind.ROCE: 200.0,
    FabricKind.ETH_100G: 12.5,
    FabricKind.ETH_25G: 3.125,
    FabricKind.ETH_10G: 1.25,
}


class DriverKind(models.TextChoices):
    LOCAL = "local", "Local sandbox (simulated hardware)"
    SSH = "ssh", "SSH"


class HostState(models.TextChoices):
    ONBOARDING = "onboarding", "Onboarding"
    AVAILABLE = "available", "Available"
    DRAINING = "draining", "Draining"
    CORDONED = "cordoned", "Cordoned"
    OFFLINE = "offline", "Offline"
    FAILED = "failed", "Onboarding failed"
    RETIRED = "retired", "Retired"


HOST_SCHEDULABLE = {HostState.AVAILABLE}
HOST_TERMINAL = {HostState.RETIRED}


class GpuHealth(models.TextChoices):
    HEALTHY = "healthy", "Healthy"
    UNHEALTHY = "unhealthy", "Unhealthy"
    LOST = "lost", "Lost"


class OnboardingError(models.TextChoices):
    """Why a host could not be onboarded; each has an actionable message in inventory.onboarding."""

    UNREACHABLE = "unreachable", "Host unreachable"
    AUTH_REFUSED = "auth_refused", "Authentication refused"
    HOST_KEY_MISMATCH = "host_key_mismatch", "Host key mismatch"
    TIMEOUT = "timeout", "Command timed out"
    NVIDIA_SMI_MISSING = "nvidia_smi_missing", "nvidia-smi missing"
    DRIVER_NOT_LOADED = "driver_not_loaded", "NVIDIA driver not loaded"
    NO_GPUS = "no_gpus", "No GPUs found"
    PARSE_FAILED = "parse_failed", "Unreadable hardware report"
    GPU_UNHEALTHY = "gpu_unhealthy", "No healthy GPU"
    GPU_OWNED_ELSEWHERE = "gpu_owned_elsewhere", "GPU belongs to another host"
    INTERNAL = "internal_error", "Volt could not record the discovery"
    DRIVER_ERROR = "driver_error", "Driver error"


class PortTransport(models.TextChoices):
    """What a NIC port carries: counted apart, so a management Ethernet port is never InfiniBand."""

    INFINIBAND = "infiniband", "InfiniBand"
    ROCE = "roce", "RoCE"
    ETHERNET = "ethernet", "Ethernet (no RDMA)"


class HostEventKind(models.TextChoices):
    STATE = "state", "State change"
    DISCOVERY = "discovery", "Discovery"
    ERROR = "error", "Error"
    HEALTH = "health", "Health check"
    RUNTIME = "runtime", "Runtime"
    REACH = "reach", "Reachability"
