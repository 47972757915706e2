"""Cluster statuses and failure reasons, with the sets code uses instead of literals."""

from django.db import models


class ClusterStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    PLACING = "placing", "Placing"
    QUEUED = "queued", "Queued"
    PROVISIONING = "provisioning", "Provisioning"
    VERIFYING = "verifying", "Verifying"
    READY = "ready", "Ready"
    DEGRADED = "degraded", "Degraded"
    RECOVERING = "recovering", "Recovering"
    TERMINATING = "terminating", "Terminating"
    TERMINATED = "terminated", "Terminated"
    FAILED = "failed", "Failed"


S = ClusterStatus
# States in which a cluster holds GPU allocations.
HOLDS_GPUS = {S.PROVISIONING, S.VERIFYING, S.READY, S.DEGRADED, S.RECOVERING, S.TERMINATING}
# States a user can still terminate or cancel from.
LIVE = {S.PENDING, S.PLACING, S.QUEUED} | HOLDS_GPUS - {S.TERMINATING}
TERMINAL = {S.TERMINATED, S.FAILED}


class FailureReason(models.TextChoices):
    """Why a cluster failed: a user must tell "no capacity" from "host broke" from "config wrong"."""

    NO_CAPACITY = "no_capacity", "No capacity"
    CONFIG_INVALID = "config_invalid", "Configuration invalid"
    HOST_FAILED = "host_failed", "Host failed"
    VERIFICATION_FAILED = "verification_failed", "Verification failed"


class Parallelism(models.TextChoices):
    DATA_PARALLEL = "data_parallel", "Data parallel / FSDP"
    TENSOR_PIPELINE = "tensor_pipeline", "Tensor + pipeline parallel"
    INFERENCE = "inference_replicas", "Inference replicas"
    INDEPENDENT = "independent", "Independent tasks"


class ConstraintMode(models.TextChoices):
    REQUIRED = "required", "Required"
    PREFERRED = "preferred", "Preferred"
    ANY = "any", "Any"


class TopologyLevel(models.TextChoices):
    BLOCK = "block", "Same block (rack / leaf switch)"
    FABRIC = "fabric", "Same fabric"
    SITE = "site", "Same site (data center)"
    REGION = "region", "Same region"


class ModelPolicy(models.TextChoices):
    ANY_OF = "any_of", "Any of (cheapest that fits)"
    ORDERED = "ordered", "Ordered (first that fits)"


# Statuses the cluster watch sweeps (clusters/telemetry/watch.py): the cluster holds running Ray nodes.
WATCHED = {S.READY, S.DEGRADED}


class Verdict(models.TextChoices):
    """A node's health after one watch sweep; the rule that fired is stored next to it."""

    OK = "ok", "OK"
    WARNING = "warning", "Warning"
    FAILED = "failed", "Failed"


class MetricSeries(models.TextChoices):
    """What a metric sample measures (units in the name)."""

    BUSBW = "busbw", "All-reduce busbw (GB/s)"
    GPU_TEMP = "gpu_temp_c", "Hottest GPU temperature (C)"
    GPU_UTIL = "gpu_util_pct", "Mean GPU utilisation (%)"
    GPU_MEMORY = "gpu_memory_used_mib", "GPU memory used (MiB)"
    GPU_POWER = "gpu_power_w", "GPU power draw (W)"


class MetricSource(models.TextChoices):
    """Where a sample came from: the all-reduce probe, the cluster watch, or a training job."""

    PROBE = "probe", "Probe"
    WATCH = "watch", "Watch"
    JOB = "job", "Job"


class BandwidthSource(models.TextChoices):
    """Who measured a BandwidthSample: Volt's probe on a cluster, or the provider (nccl-tests output it
    uploaded for its own hosts, clusters/telemetry/measurements.py)."""

    PROBE = "probe", "measured by Volt"
    PROVIDER = "provider", "measured by the provider"


class RecoveryStatus(models.TextChoices):
    """Where an automatic recovery stands (clusters/recovery.py)."""

    ACTIVE = "active", "In progress"
    WAITING = "waiting", "Waiting for capacity"
    SUCCEEDED = "succeeded", "Recovered"
    FAILED = "failed", "Failed"
    ABANDONED = "abandoned", "Abandoned (cluster terminated)"


# A recovery still to finish (the reaper and the capacity retry look for these).
RECOVERY_OPEN = {RecoveryStatus.ACTIVE, RecoveryStatus.WAITING}


class RecoveryPolicy(models.TextChoices):
    """What a cluster does when a failed node has no replacement (DESIGN.md "Jobs, checkpoints, recovery")."""

    REPLACE = "replace", "Wait for a replacement"
    SHRINK = "shrink", "Shrink to the survivors"
