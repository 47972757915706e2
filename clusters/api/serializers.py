from datetime import datetime

from rest_framework import serializers

from clusters import durations, locality, planning, recovery, services
from clusters.choices import (
    ClusterStatus,
    ConstraintMode,
    FailureReason,
    ModelPolicy,
    Parallelism,
    TopologyLevel,
)
from clusters.models import Cluster, ClusterEvent, ClusterNode
from inventory.filters import INTERCONNECT_CHOICES
from voltweb import services as accounts
from voltweb.api.fields import ScopedSlugRelatedField, StrictCharField, StrictIntegerField, StrictSlugField
from voltweb.models import Team

# Which field an engine message is about, so a 400 points at what to change.
_FIELD_HINTS = (
    ("GPUs per node", "gpus_per_node"),
    ("pipeline stages", "pipeline_stages"),
    ("nodes", "nodes"),
    ("GPU model", "gpu_models"),
    ("interconnect", "interconnect"),
    ("topology", "topology_level"),
    ("price", "max_price_per_gpu_hour"),
    ("parallelism", "parallelism"),
    ("region", "regions"),
)


def problems_by_field(problems) -> dict[str, list[str]]:
    fields: dict[str, list[str]] = {}
    for problem in problems:
        field = next((f for hint, f in _FIELD_HINTS if hint.lower() in problem.lower()), "non_field_errors")
        fields.setdefault(field, []).append(problem)
    return fields


class LocalityWaitSerializer(serializers.Serializer):
    level = serializers.ChoiceField(choices=TopologyLevel.choices, help_text="The span to wait for.")
    max_wait_s = StrictIntegerField(
        min_value=0, max_value=locality.MAX_WAIT_S, help_text="How long to wait for it (0: not at all)."
    )


class ClusterSpecSerializer(serializers.Serializer):
    """What a researcher asks for. Every field but nodes, gpus_per_node and gpu_models has a default."""

    name = StrictSlugField(max_length=100, required=False, default="cluster")
    team = ScopedSlugRelatedField(
        scope=accounts.teams_of,
        noun="team",
        slug_field="slug",
        queryset=Team.objects.all(),
        required=False,
        help_text="Your team's slug; optional when you belong to one team.",
    )
    priority = StrictIntegerField(min_value=-100, max_value=100, default=0)
    nodes = StrictIntegerField(min_value=1, max_value=1024)
    gpus_per_node = StrictIntegerField(min_value=1, max_value=16)
    gpu_models = serializers.ListField(
        child=StrictCharField(max_length=50),
        min_length=1,
        max_length=8,
        help_text='e.g. ["H100"] or ["H100", "A100"]',
    )
    model_policy = serializers.ChoiceField(choices=ModelPolicy.choices, default=ModelPolicy.ANY_OF)
    interconnect = serializers.ListField(
        child=serializers.ChoiceField(choices=INTERCONNECT_CHOICES), required=False, default=list
    )
    interconnect_mode = serializers.ChoiceField(choices=ConstraintMode.choices, default=ConstraintMode.ANY)
    topology_level = serializers.ChoiceField(
        choices=TopologyLevel.choices, required=False, allow_null=True, default=None
    )
    topology_mode = serializers.ChoiceField(choices=ConstraintMode.choices, default=ConstraintMode.ANY)
    regions = serializers.ListField(child=StrictCharField(max_length=50), required=False, default=list)
    max_price_per_gpu_hour = serializers.DecimalField(
        max_digits=8, decimal_places=2, required=False, allow_null=True, min_value=0, default=None
    )
    parallelism = serializers.ChoiceField(choices=Parallelism.choices, default=Parallelism.DATA_PARALLEL)
    pipeline_stages = StrictIntegerField(min_value=0, max_value=1024, default=0)
    # A list of objects, each one required (not null): ListField over the object serializer, where
    # many=True would pass allow_null on to each item too.
    wait_for_locality = serializers.ListField(
        child=LocalityWaitSerializer(),
        required=False,
        allow_null=True,
        default=None,
        help_text='Wait for a tighter span before placing wider, e.g. [{"level": "site", "max_wait_s": 1800}]: '
        "one site for up to 30 min, then anywhere with a warning. Null: collective multi-node requests wait "
        "VOLT_LOCALITY_WAIT_S for one site; []: never wait. A level no single domain could ever hold is not "
        "waited for.",
    )

    duration_s = StrictIntegerField(
        min_value=60,
        max_value=durations.MAX_DURATION_S,
        required=False,
        allow_null=True,
        default=None,
        help_text="How long the team needs it, from placement: Volt warns VOLT_DURATION_WARN_S before the end, "
        "then terminates it unless extended (POST .../extend/). Null: until terminated.",
    )

    def validate_wait_for_locality(self, value):
        if value is None:
            return None
        levels = [wait["level"] for wait in value]
        if len(set(levels)) != len(levels):
            raise serializers.ValidationError("Name each level once.")
        return [{"level": wait["level"], "max_wait_s": wait["max_wait_s"]} for wait in value]

    def validate(self, attrs):
        user = self.context["request"].user
        if "team" not in attrs and self.context.get("needs_team", True):
            teams = list(accounts.teams_of(user)[:2])
            if len(teams) != 1:
                raise serializers.ValidationError({"team": "Name the team (slug) the cluster belongs to."})
            attrs["team"] = teams[0]
        try:
            planning.validate_spec(self.spec(attrs))
        except planning.InvalidSpec as exc:
            raise serializers.ValidationError(problems_by_field(exc.problems)) from None
        return attrs

    @staticmethod
    def spec(attrs) -> dict:
        spec = {k: v for k, v in attrs.items() if k != "team"}
        if spec.get("wait_for_locality") is None:
            spec.pop("wait_for_locality", None)  # the default applies (clusters/locality.py)
        if spec.get("duration_s") is None:
            spec.pop("duration_s", None)
        if spec.get("max_price_per_gpu_hour") is not None:
            spec["max_price_per_gpu_hour"] = str(spec["max_price_per_gpu_hour"])
        return spec


class ExtendSerializer(serializers.Serializer):
    seconds = StrictIntegerField(
        min_value=60, max_value=durations.MAX_DURATION_S, help_text="How much later it ends, e.g. 3600."
    )


class ClusterNodeSerializer(serializers.ModelSerializer):
    host = serializers.CharField(source="host.name")
    site = serializers.CharField(source="host.site.name")
    block = serializers.CharField(source="host.block.name")
    address = serializers.CharField(
        source="node_ip",
        read_only=True,
        help_text="Where its Ray node listens: on the cluster's overlay if any.",
    )

    class Meta:
        model = ClusterNode
        fields = ["rank", "host", "site", "block", "is_head", "stage", "gpu_indices", "address"]


class ClusterSerializer(serializers.ModelSerializer):
    team = serializers.CharField(source="team.slug")
    failure_reason = serializers.ChoiceField(choices=FailureReason.choices, allow_blank=True, read_only=True)
    created_by = serializers.CharField(source="created_by.username", default=None, allow_null=True)
    queue_position = serializers.SerializerMethodField()
    nodes = serializers.SerializerMethodField()
    connection = serializers.SerializerMethodField()
    recovery = serializers.SerializerMethodField()
    time_left_s = serializers.SerializerMethodField()
    starts_by = serializers.SerializerMethodField()
    start_bound_note = serializers.SerializerMethodField()

    class Meta:
        model = Cluster
        fields = [
            "id", "name", "team", "created_by", "status", "priority", "spec", "gpu_model",
            "predicted_busbw_gbps", "predicted_allreduce_s", "measured_busbw_gbps", "bandwidth_flagged",
            "slow_hosts_replaced", "price_per_hour", "queue_position", "queue_reason", "failure_reason",
            "failure_message",
            "starts_by", "start_bound_note",  # the queue's reservation (clusters/reservations.py)
            "connection", "probe_result", "plan", "nodes", "created_at", "queued_at", "placed_at", "ready_at",
            "ended_at", "ends_at", "time_left_s",  # a requested duration (clusters/durations.py)
            "bandwidth_alert", "last_probe_at", "probe_interval_min",  # telemetry (clusters/telemetry/bandwidth_watch.py)
            "recovery_policy", "recovery",  # clusters/recovery.py
            "network_path", "overlay_network",  # clusters/provisioning/cluster_overlay.py
        ]  # fmt: skip
        read_only_fields = fields

    def get_time_left_s(self, cluster) -> float | None:
        """Seconds until its requested duration runs out (then Volt terminates it); null without one."""
        left = durations.time_left_s(cluster)
        return None if left is None else round(left, 1)

    def get_starts_by(self, cluster) -> datetime | None:
        """While queued: its start bound, the latest it should start (the queue holds hosts for it from
        then); null without one (start_bound_note says why)."""
        if cluster.status != ClusterStatus.QUEUED or cluster.reserved_from is None:
            return None
        return serializers.DateTimeField().to_representation(cluster.reserved_from)

    def get_start_bound_note(self, cluster) -> str:
        """While queued without a start bound: why there is none yet."""
        return cluster.start_bound_note if cluster.status == ClusterStatus.QUEUED else ""

    def get_queue_position(self, cluster) -> int | None:
        return services.queue_position(cluster)

    def get_nodes(self, cluster) -> list[dict]:
        """The cluster's current nodes (replaced ones are left out)."""
        nodes = [n for n in cluster.nodes.all() if n.released_at is None]
        return ClusterNodeSerializer(nodes, many=True).data

    def get_connection(self, cluster) -> dict | None:
        """How to use a READY cluster: Ray address, dashboard / job submission, SSH, storage, key, and (on
        the cluster itself, for its team only; never in lists) its Ray token."""
        view, request = self.context.get("view"), self.context.get("request")
        detail = view is not None and getattr(view, "action", None) == "retrieve" and request is not None
        return services.connection_details(cluster, request.user if detail else None)

    def get_recovery(self, cluster) -> dict | None:
        """The latest automatic recovery (all of them: GET .../recoveries/); on the cluster itself only."""
        view = self.context.get("view")
        if view is None or getattr(view, "action", None) != "retrieve":
            return None
        latest = recovery.recoveries(cluster).first()
        return recovery.as_json(latest) if latest else None


class ClusterEventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(
        source="actor.username",
        default=None,
        allow_null=True,
        read_only=True,
        help_text="Who did it, if a person.",
    )

    class Meta:
        model = ClusterEvent
        fields = ["at", "from_status", "to_status", "message", "actor"]


class PlanNodeSerializer(serializers.Serializer):
    rank = serializers.IntegerField()
    host_id = serializers.IntegerField()
    host = serializers.CharField()
    provider = serializers.CharField()
    region = serializers.CharField()
    site = serializers.CharField()
    fabric = serializers.CharField()
    block = serializers.CharField()
    gpu_indices = serializers.ListField(child=serializers.IntegerField())


class PreviewSerializer(serializers.Serializer):
    placed = serializers.BooleanField()
    reasons = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        help_text="Binding constraints when nothing fits (the request would queue).",
    )
    model = serializers.CharField(required=False)
    nodes = PlanNodeSerializer(many=True, required=False)
    head_host_id = serializers.CharField(required=False)
    spanned_level = serializers.CharField(required=False)
    predicted_busbw_gbps = serializers.FloatField(required=False, allow_null=True)
    predicted_allreduce_s = serializers.FloatField(required=False, allow_null=True)
    price_per_hour = serializers.FloatField(required=False)
    explanation = serializers.ListField(child=serializers.CharField())
    warnings = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        help_text="What the plan costs that the figures may not say (a collective job across a WAN), and how to avoid it.",
    )
    stage_order = serializers.ListField(
        child=serializers.ListField(child=serializers.CharField()), required=False
    )
