"""Clusters: a team's request, where placement put it, the GPUs it holds, and its timeline."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models.functions import Coalesce
from django.utils import timezone

from clusters.choices import (
    BandwidthSource,
    ClusterStatus,
    FailureReason,
    MetricSeries,
    MetricSource,
    Parallelism,
    RecoveryPolicy,
    RecoveryStatus,
    Verdict,
)
from clusters.placement.bandwidth import format_gbps
from inventory.models import GPU, Host
from voltweb.models import Team
from voltweb.services import teams_of


class ClusterQuerySet(models.QuerySet):
    def visible_to(self, user) -> ClusterQuerySet:
        """Clusters of the caller's teams (platform admins: all). Another team's cluster is a 404."""
        return self.filter(team__in=teams_of(user))

    def queued(self) -> ClusterQuerySet:
        """Queued clusters in placement order: priority first, then first come first served."""
        return self.filter(status=ClusterStatus.QUEUED).order_by(
            models.F("priority").desc(), "queued_at", "id"
        )

    def with_queue_position(self) -> ClusterQuerySet:
        """Annotate `queue_position` (1-based; None when not queued) in the same query: a list of
        queued clusters costs no query per row. Counts every team's queued clusters ahead."""
        ahead = (
            Cluster.objects.filter(status=ClusterStatus.QUEUED)
            .filter(
                models.Q(priority__gt=models.OuterRef("priority"))
                | models.Q(priority=models.OuterRef("priority"), queued_at__lt=models.OuterRef("queued_at"))
                | models.Q(
                    priority=models.OuterRef("priority"),
                    queued_at=models.OuterRef("queued_at"),
                    id__lt=models.OuterRef("id"),
                )
            )
            .order_by()
            .annotate(n=models.Func(models.F("id"), function="COUNT"))
            .values("n")
        )
        return self.annotate(
            queue_position=models.Case(
                models.When(
                    status=ClusterStatus.QUEUED,
                    then=Coalesce(models.Subquery(ahead), 0) + 1,
                ),
                default=None,
                output_field=models.IntegerField(null=True),
            )
        )


class Cluster(models.Model):
    """A multi-node cluster request and its lifecycle (clusters/transitions.py)."""

    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="clusters")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL)
    name = models.CharField(max_length=100)
    status = models.CharField(max_length=20, choices=ClusterStatus.choices, default=ClusterStatus.PENDING)
    priority = models.IntegerField(default=0, help_text="Higher is placed first from the queue.")
    spec = models.JSONField(help_text="The placement request as submitted (validated).")
    plan = models.JSONField(null=True, blank=True, help_text="The placement plan, with its explanation.")
    gpu_model = models.CharField(max_length=50, blank=True)
    predicted_busbw_gbps = models.FloatField(null=True, blank=True, help_text="GB/s, nccl-tests busbw.")
    predicted_allreduce_s = models.FloatField(null=True, blank=True)
    price_per_hour = models.DecimalField(max_digits=10, decimal_places=2, null=True, blank=True)
    queue_reason = models.TextField(blank=True, help_text="Why it waits: the binding constraints.")
    failure_reason = models.CharField(max_length=30, choices=FailureReason.choices, blank=True)
    failure_message = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    queued_at = models.DateTimeField(null=True, blank=True)
    placed_at = models.DateTimeField(null=True, blank=True)
    ready_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    ends_at = models.DateTimeField(
        null=True, blank=True, help_text="Its requested duration runs out: placement + duration_s, extended."
    )
    end_warned_at = models.DateTimeField(
        null=True, blank=True, help_text="When the team was warned of ends_at (cleared by an extension)."
    )
    # The queue's reservation (clusters/reservations.py): its start bound and the hosts held for it.
    reserved_from = models.DateTimeField(
        null=True, blank=True, help_text="While queued: the start bound, the earliest time it can start."
    )
    reserved_until = models.DateTimeField(
        null=True, blank=True, help_text="The reservation's end: reserved_from + duration_s (none without)."
    )
    reserved_hosts = models.JSONField(
        default=list, blank=True, help_text="Host ids held for the reservation."
    )
    start_bound_note = models.CharField(
        max_length=300, blank=True, help_text="While queued without a start bound: why there is none."
    )
    updated_at = models.DateTimeField(auto_now=True)
    # Provisioning and hand-off (clusters/provision.py).
    ssh_public_key = models.TextField(
        blank=True, help_text="The cluster's ed25519 key, authorized on its hosts."
    )
    ssh_private_key_encrypted = models.TextField(
        blank=True, help_text="Fernet-encrypted; downloadable by the team."
    )
    ray_auth_token_encrypted = models.TextField(
        blank=True, help_text="The cluster's Ray token (RAY_AUTH_MODE=token), Fernet-encrypted; for the team."
    )
    # Its identity in the checkpoint store (clusters/checkpoint_store.py), confined by the store to its prefix.
    store_access_key = models.CharField(
        max_length=128,
        blank=True,
        help_text="The cluster's key in the checkpoint store (none: no store); kept once revoked, as a record.",
    )
    store_secret_key_encrypted = models.TextField(
        blank=True,
        help_text="That key's secret, Fernet-encrypted; its jobs get it in their environment. Empty once revoked.",
    )
    node_user = models.CharField(
        max_length=32,
        blank=True,
        help_text="Unix user its Ray processes run as on local hosts (empty: the host's own user).",
    )
    node_user_removed_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When its Unix user was removed; an ended cluster without it is retried by a reaper.",
    )
    ray_address = models.CharField(
        max_length=100, blank=True, help_text="GCS address workers and drivers join."
    )
    dashboard_url = models.CharField(
        max_length=200, blank=True, help_text="Ray dashboard and job submission."
    )
    storage_path = models.CharField(
        max_length=300, blank=True, help_text="Shared storage path on every host."
    )
    network_path = models.CharField(
        max_length=10, blank=True,
        help_text="How its nodes reach each other: direct, overlay (WireGuard) or relay (some pairs through a "
        "node that forwards); empty until its nodes are up (clusters/provisioning/cluster_overlay.py).",
    )  # fmt: skip
    overlay_network = models.CharField(
        max_length=20,
        blank=True,
        help_text="Its overlay's own range (100.96.0.0/12, a /24 per live cluster).",
    )
    provision_attempts = models.PositiveIntegerField(default=0)
    provisioning_started_at = models.DateTimeField(null=True, blank=True)
    probe_result = models.JSONField(null=True, blank=True, help_text="All-reduce probe, nccl-tests style.")
    measured_busbw_gbps = models.FloatField(null=True, blank=True, help_text="Largest probe busbw, GB/s.")
    bandwidth_flagged = models.BooleanField(
        default=False, help_text="Measured busbw below the expected share."
    )
    slow_hosts_replaced = models.PositiveIntegerField(
        default=0, help_text="Hosts replaced before READY for being the probe's slowest."
    )
    # Telemetry (clusters/telemetry/watch.py, clusters/telemetry/bandwidth_watch.py).
    probe_interval_min = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Minutes between idle probes; empty: VOLT_PROBE_INTERVAL_MIN; 0: off.",
    )
    last_probe_at = models.DateTimeField(null=True, blank=True)
    bandwidth_alert = models.TextField(blank=True, help_text="Latest probe below the flag fraction, and why.")
    recovery_policy = models.CharField(
        max_length=10,
        choices=RecoveryPolicy.choices,
        default=RecoveryPolicy.REPLACE,
        help_text="No replacement for a failed node: wait for one, or shrink to the survivors.",
    )

    objects = ClusterQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["status", "-priority", "queued_at"], name="cluster_queue_idx")]
        constraints = [
            # One live cluster per overlay range: two clusters allocating at once cannot take the same one.
            models.UniqueConstraint(
                fields=["overlay_network"],
                condition=~models.Q(overlay_network="") & ~models.Q(status__in=["terminated", "failed"]),
                name="cluster_overlay_network_live_unique",
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.status})"

    @property
    def shape(self) -> str:
        """Nodes × GPUs per node and the model placed (or the models asked for, until placed): 2 × 8 H100."""
        models_text = self.gpu_model or " / ".join(self.spec.get("gpu_models", []))
        return f"{self.spec.get('nodes')} × {self.spec.get('gpus_per_node')} {models_text}"

    @property
    def parallelism_label(self) -> str:
        """The request's parallelism as the form names it ("Data parallel / FSDP")."""
        value = self.spec.get("parallelism", "")
        return Parallelism(value).label if value in Parallelism.values else value


class ClusterNodeQuerySet(models.QuerySet):
    def active(self) -> ClusterNodeQuerySet:
        """Nodes still part of their cluster: not released (a replaced node, or the cluster ended)."""
        return self.filter(released_at__isnull=True)


class ClusterNode(models.Model):
    """One node of a placed cluster: a host, its rank, and (pipeline parallel) its stage."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="nodes")
    host = models.ForeignKey(Host, on_delete=models.PROTECT, related_name="cluster_nodes")
    rank = models.PositiveIntegerField()
    is_head = models.BooleanField(default=False)
    stage = models.PositiveIntegerField(null=True, blank=True)
    gpu_indices = models.JSONField(default=list)
    released_at = models.DateTimeField(null=True, blank=True)
    machine = models.CharField(
        max_length=64, blank=True, help_text="Where the node's ports live: 'local' or host id."
    )
    slot = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="Ray port block (ray_nodes.ports_for)."
    )
    cleaned_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When the cluster's final teardown left nothing of it on this node's host (processes, Unix "
        "user, key, workdir); empty on an ended cluster while the host still holds them (it did not answer): "
        "the reaper tries again.",
    )

    overlay_address = models.GenericIPAddressField(
        protocol="IPv4",
        null=True,
        blank=True,
        help_text="Its address on the cluster's overlay, when it has one.",
    )
    overlay_port = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="Its overlay interface's UDP port on the host: 51820 (the one a provider forwards) for the "
        "host's first overlay, the next free one for others.",
    )  # fmt: skip

    objects = ClusterNodeQuerySet.as_manager()

    class Meta:
        ordering = ["cluster_id", "rank"]
        constraints = [
            models.UniqueConstraint(
                fields=["machine", "slot"],
                condition=models.Q(released_at__isnull=True, slot__isnull=False),
                name="clusternode_one_active_slot_per_machine",
            )
        ]

    def __str__(self) -> str:
        return f"{self.cluster_id}/rank{self.rank} on {self.host_id}"

    @property
    def node_ip(self) -> str:
        """The address its Ray node, the probe and the job's collectives bind and advertise: on the cluster's
        overlay when it has one, else the host's own (Host.node_ip)."""
        return self.overlay_address or self.host.node_ip


class Allocation(models.Model):
    """One GPU held by one cluster. The partial unique index is what guarantees no double booking."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="allocations")
    node = models.ForeignKey(ClusterNode, on_delete=models.CASCADE, related_name="allocations")
    gpu = models.ForeignKey(GPU, on_delete=models.PROTECT, related_name="allocations")
    active = models.BooleanField(default=True)
    allocated_at = models.DateTimeField(default=timezone.now)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["gpu"], condition=models.Q(active=True), name="allocation_one_active_per_gpu"
            ),
        ]

    def __str__(self) -> str:
        return f"gpu {self.gpu_id} -> cluster {self.cluster_id}{'' if self.active else ' (released)'}"


class ClusterEvent(models.Model):
    """A line of a cluster's timeline: every status change, with its reason; and audited actions."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(default=timezone.now)
    from_status = models.CharField(max_length=20, blank=True)
    to_status = models.CharField(max_length=20, blank=True)
    message = models.TextField(blank=True)
    # Who did it, for events people cause (e.g. an SSH key download: an audit line, no status change).
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.cluster_id}: {self.from_status} -> {self.to_status}"


class BandwidthSample(models.Model):
    """A measured all-reduce busbw of the link class a probe exercised: the coarsest level its cluster
    spanned, in that domain. Placement applies it as an efficiency (measured / declared) of that domain.

    `source` provider: nccl-tests output a provider (or a platform admin) uploaded for a set of hosts
    (clusters.telemetry.measurements); level "host" for one machine's GPUs. Placement uses such a figure only for a
    block or fabric (a provider's own domains), where Volt measured nothing itself, and never above
    `predicted_gbps` (what Volt predicted for those hosts when it was uploaded)."""

    level = models.CharField(max_length=10)  # host, block, fabric, site, region, global
    domain_id = models.CharField(max_length=100)
    busbw_gbps = models.FloatField(help_text="GB/s, nccl-tests busbw at large message size.")
    nodes = models.PositiveIntegerField(default=2)
    measured_at = models.DateTimeField(default=timezone.now, db_index=True)
    cluster = models.ForeignKey(Cluster, null=True, blank=True, on_delete=models.SET_NULL)
    # A probe between `local` hosts measures this machine's loopback (or its emulation), not a fabric:
    # placement ignores such samples unless the links were emulated (shaped to the declared figures).
    source_local = models.BooleanField(default=False, help_text="Measured between local (sandbox) hosts.")
    emulated = models.BooleanField(default=False, help_text="The links were shaped by the fabric emulation.")
    source = models.CharField(max_length=10, choices=BandwidthSource.choices, default=BandwidthSource.PROBE)
    predicted_gbps = models.FloatField(
        null=True,
        blank=True,
        help_text="Volt's prediction for the measured hosts when the figure arrived (GB/s).",
    )
    uploaded_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    details = models.JSONField(
        default=dict, blank=True, help_text="An upload's hosts, GPUs, sizes and nccl-tests' average busbw."
    )

    class Meta:
        ordering = ["-measured_at"]
        indexes = [models.Index(fields=["level", "domain_id", "-measured_at"], name="bwsample_domain_idx")]

    def __str__(self) -> str:
        return f"{self.level}:{self.domain_id} {format_gbps(self.busbw_gbps)} GB/s"


# --- telemetry (clusters/telemetry/watch.py, clusters/telemetry/metrics.py) ----------------------------------------------


class NodeHealth(models.Model):
    """A node's verdict from the latest watch sweep, with the rule that fired and the readings behind it."""

    node = models.OneToOneField(ClusterNode, on_delete=models.CASCADE, related_name="health")
    verdict = models.CharField(max_length=10, choices=Verdict.choices, default=Verdict.OK)
    rule = models.CharField(max_length=300, blank=True, help_text="Why the verdict is not ok.")
    readings = models.JSONField(default=dict, help_text="Per-GPU temperature/utilisation/memory/power/ECC.")
    checked_at = models.DateTimeField(default=timezone.now)
    changed_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"node {self.node_id}: {self.verdict}"


class MetricSample(models.Model):
    """One raw measurement of a cluster (or of one of its hosts); kept VOLT_METRICS_RAW_RETENTION_H."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="samples")
    host = models.ForeignKey(Host, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    series = models.CharField(max_length=30, choices=MetricSeries.choices)
    source = models.CharField(max_length=10, choices=MetricSource.choices, default=MetricSource.WATCH)
    value = models.FloatField()
    ts = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["ts", "id"]
        indexes = [
            models.Index(fields=["cluster", "series", "ts"], name="sample_series_ts_idx"),
            models.Index(fields=["ts"], name="sample_ts_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.cluster_id}/{self.series}={self.value:g} @ {self.ts:%H:%M:%S}"


class MetricMinute(models.Model):
    """Per-minute aggregate of raw samples (same cluster, host, series, source); kept 30 days."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="minutes")
    host = models.ForeignKey(Host, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    series = models.CharField(max_length=30, choices=MetricSeries.choices)
    source = models.CharField(max_length=10, choices=MetricSource.choices, default=MetricSource.WATCH)
    minute = models.DateTimeField()
    count = models.PositiveIntegerField()
    mean = models.FloatField()
    minimum = models.FloatField()
    maximum = models.FloatField()

    class Meta:
        ordering = ["minute", "id"]
        indexes = [models.Index(fields=["cluster", "series", "minute"], name="minute_series_idx")]

    def __str__(self) -> str:
        return f"{self.cluster_id}/{self.series} {self.minute:%H:%M} mean {self.mean:g}"


class Recovery(models.Model):
    """One automatic recovery of a cluster (clusters/recovery.py): what failed, what replaced it, and when.

    `phases` is the list of phases with their start and end times ({"phase", "started", "ended"});
    each job the jobs app's hook resumed, and what it lost, is a RecoveryJob row (`jobs`: as the API
    shows them; clusters/recovery.py, "Accounting").
    """

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="recoveries")
    status = models.CharField(max_length=12, choices=RecoveryStatus.choices, default=RecoveryStatus.ACTIVE)
    phase = models.CharField(max_length=30, default="detected")
    cause = models.TextField(help_text="The watch's verdict (or the drill) that started it.")
    failed_hosts = models.JSONField(default=list, help_text='[{"id", "name", "rank", "is_head", "rule"}]')
    head_lost = models.BooleanField(default=False)
    replacement_hosts = models.JSONField(default=list, help_text='[{"id", "name", "rank", "is_head"}]')
    replacement_reason = models.TextField(
        blank=True, help_text="Why these hosts: how close to the survivors."
    )
    waiting_reason = models.TextField(blank=True, help_text="Why it waits (no capacity), while it waits.")
    attempts = models.PositiveIntegerField(default=0, help_text="Replacements that failed to come up.")
    message = models.TextField(blank=True, help_text="How it ended.")
    detected_at = models.DateTimeField(default=timezone.now)
    replacement_placed_at = models.DateTimeField(null=True, blank=True)
    replacement_ready_at = models.DateTimeField(null=True, blank=True)
    ready_at = models.DateTimeField(null=True, blank=True)
    job_resubmitted_at = models.DateTimeField(
        null=True, blank=True, help_text="The interrupted jobs were handed to Ray again."
    )
    training_resumed_at = models.DateTimeField(
        null=True, blank=True, help_text="A resubmitted job logged a training step again (its own clock)."
    )
    ended_at = models.DateTimeField(null=True, blank=True)
    phases = models.JSONField(default=list)
    checkpoint_step = models.IntegerField(null=True, blank=True)
    steps_lost = models.IntegerField(null=True, blank=True)
    steps_lost_is_lower_bound = models.BooleanField(
        default=False, help_text="The job may have stepped past the last step it logged."
    )
    gpu_hours_lost = models.FloatField(
        null=True,
        blank=True,
        help_text="GPUs of the cluster x (detection -> training stepped again + the lost steps' time).",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-detected_at", "-id"]

    def __str__(self) -> str:
        return f"recovery of {self.cluster_id} ({self.status}, {self.phase})"

    @property
    def jobs(self) -> list[dict]:
        """The jobs it resubmitted, one dict each (prefetch `job_rows` to read many records at once)."""
        return [row.as_json() for row in self.job_rows.all()]


class RecoveryJob(models.Model):
    """One job a recovery resubmitted, and what it lost: the per-job accounting, a row each.

    `job_id` is the jobs app's Job (an id, not a foreign key: clusters do not depend on jobs).
    """

    recovery = models.ForeignKey(Recovery, on_delete=models.CASCADE, related_name="job_rows")
    job_id = models.PositiveBigIntegerField(db_index=True)
    name = models.CharField(max_length=100, blank=True)
    attempt = models.PositiveIntegerField(help_text="The attempt the recovery resubmitted.")
    last_step = models.IntegerField(null=True, blank=True, help_text="The last step the job reached.")
    checkpoint_step = models.IntegerField(null=True, blank=True)
    checkpoint_path = models.CharField(max_length=500, blank=True)
    steps_lost = models.IntegerField(default=0)
    steps_lost_is_lower_bound = models.BooleanField(default=False)
    step_s = models.FloatField(null=True, blank=True, help_text="The job's mean step time.")
    gpus = models.PositiveIntegerField(default=0)
    resubmitted_at = models.DateTimeField()
    training_resumed_at = models.DateTimeField(null=True, blank=True)
    gpu_hours_lost = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["recovery", "job_id", "attempt"], name="recovery_job_attempt_once"
            )
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} attempt {self.attempt} of recovery {self.recovery_id}"

    @property
    def lost_steps_s(self) -> float:
        return (self.steps_lost or 0) * (self.step_s or 0.0)

    def as_json(self) -> dict:
        def iso(value):
            return value.isoformat() if value else None

        resumed_s = None
        if self.training_resumed_at is not None:
            resumed_s = round((self.training_resumed_at - self.recovery.detected_at).total_seconds(), 3)
        return {
            "job": self.job_id, "name": self.name, "attempt": self.attempt, "last_step": self.last_step,
            "checkpoint_step": self.checkpoint_step, "checkpoint_path": self.checkpoint_path or None,
            "steps_lost": self.steps_lost, "steps_lost_is_lower_bound": self.steps_lost_is_lower_bound,
            "step_s": self.step_s, "gpus": self.gpus, "resubmitted_at": iso(self.resubmitted_at),
            "training_resumed_at": iso(self.training_resumed_at), "training_resumed_s": resumed_s,
            "gpu_hours_lost": self.gpu_hours_lost,
        }  # fmt: skip
