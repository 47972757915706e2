"""Recovery API: a cluster's recovery records, its recovery policy, and fault drills."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.response import Response

from clusters import drills, recovery
from clusters.api.serializers import ClusterSerializer
from clusters.choices import RecoveryPolicy
from clusters.models import Cluster
from voltweb.api.errors import ErrorResponseSerializer
from voltweb.api.fields import StrictIntegerField

ERRORS = {400: ErrorResponseSerializer, 401: ErrorResponseSerializer, 404: ErrorResponseSerializer}


class RecoveryRecordSerializer(serializers.Serializer):
    """One automatic recovery: what failed, what replaced it and why, and when each phase ran."""

    id = serializers.IntegerField()
    status = serializers.CharField(help_text="active, waiting (no capacity), succeeded, failed, abandoned.")
    phase = serializers.CharField(
        help_text="detected, stopping, placing, waiting_for_capacity, provisioning, verifying, resuming, done."
    )
    cause = serializers.CharField()
    failed_hosts = serializers.ListField(child=serializers.DictField())
    head_lost = serializers.BooleanField()
    replacement_hosts = serializers.ListField(child=serializers.DictField())
    replacement_reason = serializers.CharField(help_text="Why these hosts: how close to the survivors.")
    waiting_reason = serializers.CharField()
    attempts = serializers.IntegerField(help_text="Replacements that failed to come up.")
    message = serializers.CharField()
    detected_at = serializers.DateTimeField()
    replacement_placed_at = serializers.DateTimeField(allow_null=True)
    replacement_ready_at = serializers.DateTimeField(allow_null=True)
    ready_at = serializers.DateTimeField(allow_null=True)
    job_resubmitted_at = serializers.DateTimeField(
        allow_null=True, help_text="The interrupted jobs were handed to Ray again."
    )
    training_resumed_at = serializers.DateTimeField(
        allow_null=True,
        help_text="A resubmitted job logged a training step again (the workload's clock); null until then.",
    )
    ended_at = serializers.DateTimeField(allow_null=True)
    replacement_ready_s = serializers.FloatField(allow_null=True, help_text="Seconds from detection.")
    ready_s = serializers.FloatField(allow_null=True, help_text="Seconds from detection to READY.")
    job_resubmitted_s = serializers.FloatField(
        allow_null=True, help_text="Seconds from detection to the jobs' resubmission."
    )
    training_resumed_s = serializers.FloatField(
        allow_null=True, help_text="Seconds from detection to a resubmitted job's first training step."
    )
    phases = serializers.ListField(child=serializers.DictField(), help_text="{phase, started, ended} each.")
    jobs = serializers.ListField(
        child=serializers.DictField(),
        help_text="Per job resubmitted: job, name, attempt, checkpoint_step, checkpoint_path, last_step, "
        "steps_lost, steps_lost_is_lower_bound, step_s, gpus, resubmitted_at, training_resumed_at, "
        "training_resumed_s, gpu_hours_lost.",
    )
    checkpoint_step = serializers.IntegerField(allow_null=True)
    steps_lost = serializers.IntegerField(
        allow_null=True, help_text="The last step the job reached (its events) minus the checkpoint's step."
    )
    steps_lost_is_lower_bound = serializers.BooleanField(
        help_text="True when the job may have stepped past its last logged step (it does not log every step)."
    )
    gpu_hours_lost = serializers.FloatField(
        allow_null=True,
        help_text="GPUs x (detection -> training stepped again, or until then the resubmission) + the lost "
        "steps' time; the downtime is counted once.",
    )


class RecoveryPolicySerializer(serializers.Serializer):
    recovery_policy = serializers.ChoiceField(
        choices=RecoveryPolicy.choices,
        help_text="replace: wait for a replacement; shrink: re-form on the survivors when none is free "
        "(data-parallel workloads whose world size follows the node count, like the demo).",
    )


class DrillSerializer(serializers.Serializer):
    drill = serializers.ChoiceField(choices=drills.DRILLS)
    rank = StrictIntegerField(min_value=0, help_text="The node's rank (the cluster's nodes list).")
    value = serializers.CharField(required=False, allow_blank=True, default="", max_length=20)


class DrillResultSerializer(serializers.Serializer):
    drill = serializers.CharField()
    host = serializers.CharField()
    rank = serializers.IntegerField()
    detail = serializers.CharField()


class DrillListSerializer(serializers.Serializer):
    drill = serializers.CharField()
    description = serializers.CharField()
    value = serializers.CharField(allow_null=True)


class ClusterRecoveryViewSet(viewsets.GenericViewSet):
    """Recovery of your teams' clusters (another team's cluster is a 404, as everywhere)."""

    queryset = Cluster.objects.none()
    serializer_class = RecoveryRecordSerializer

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Cluster.objects.none()
        return Cluster.objects.visible_to(self.request.user)

    @extend_schema(responses={200: RecoveryRecordSerializer(many=True), **ERRORS})
    @action(detail=True, methods=["get"])
    def recoveries(self, request, pk=None):
        """Every automatic recovery of the cluster, newest first (paginated)."""
        cluster = self.get_object()
        page = self.paginate_queryset(recovery.recoveries(cluster))
        return self.get_paginated_response([recovery.as_json(r) for r in page])

    @extend_schema(
        request=RecoveryPolicySerializer,
        responses={200: ClusterSerializer, 403: ErrorResponseSerializer, **ERRORS},
    )
    @action(detail=True, methods=["patch"], url_path="recovery-policy")
    def recovery_policy(self, request, pk=None):
        """What the cluster does when a failed node has no replacement (team admins)."""
        cluster = self.get_object()
        if not drills.may_run_drills(request.user, cluster):
            raise PermissionDenied("Only platform admins and the admins of the cluster's team change it.")
        body = RecoveryPolicySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        Cluster.objects.filter(pk=cluster.pk).update(recovery_policy=body.validated_data["recovery_policy"])
        cluster.refresh_from_db()
        return Response(ClusterSerializer(cluster).data)

    @extend_schema(methods=["get"], request=None, responses={200: DrillListSerializer(many=True), **ERRORS})
    @extend_schema(
        methods=["post", "delete"],
        request=DrillSerializer,
        responses={200: DrillResultSerializer, 403: ErrorResponseSerializer, **ERRORS},
    )
    @action(detail=True, methods=["get", "post", "delete"])
    def drills(self, request, pk=None):
        """Fault drills (platform admins and the cluster team's admins; audited on the timeline): GET lists
        them, POST runs `drill` on the node of `rank` (`value` for link_degraded), DELETE clears a fault."""
        cluster = self.get_object()
        if not drills.may_run_drills(request.user, cluster):
            raise PermissionDenied("Only platform admins and the admins of the cluster's team run drills.")
        if request.method == "GET":  # paginated like every collection (the schema says a page)
            page = self.paginate_queryset(drills.describe())
            return self.get_paginated_response(DrillListSerializer(page, many=True).data)
        body = DrillSerializer(data=request.data or request.query_params)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        try:
            result = drills.run_drill(
                cluster, request.user, data["drill"], rank=data["rank"], value=data["value"],
                clear=request.method == "DELETE",
            )  # fmt: skip
        except drills.DrillRefused as exc:
            if exc.forbidden:
                raise PermissionDenied(str(exc)) from None
            raise ValidationError({exc.field: [str(exc)]}) from None
        return Response(DrillResultSerializer(result).data)
