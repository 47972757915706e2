"""Team quota API: `/api/v1/teams/{id}/quota/` — a team's limits, its use against them and the audit trail
of their changes. Anyone who sees the team reads it; platform admins change it (PUT, PATCH).

It lives in the clusters app because use is read from the clusters' allocations (clusters/quotas.py);
the limits themselves are the accounts app's (`voltweb.services.set_team_quota`, audited there).
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from clusters import quotas
from voltweb import services as accounts
from voltweb.api.errors import ErrorResponseSerializer
from voltweb.api.fields import StrictIntegerField
from voltweb.models import Team

ERRORS = {
    400: ErrorResponseSerializer,
    401: ErrorResponseSerializer,
    403: ErrorResponseSerializer,
    404: ErrorResponseSerializer,
}
AUDIT_LINES = 20


class QuotaLimitsSerializer(serializers.Serializer):
    max_gpus = StrictIntegerField(
        min_value=0, allow_null=True, required=False, help_text="GPUs in use at once; null: no cap."
    )
    gpu_model_caps = serializers.DictField(
        child=StrictIntegerField(min_value=0),
        required=False,
        help_text='GPUs in use per GPU model, e.g. {"H100": 8} (a family caps its variants); {}: none.',
    )
    gpu_hours_per_month = StrictIntegerField(
        min_value=0,
        allow_null=True,
        required=False,
        help_text="GPU-hours per calendar month (UTC); null: none.",
    )


class ModelUseSerializer(serializers.Serializer):
    model = serializers.CharField()
    in_use = serializers.IntegerField()
    cap = serializers.IntegerField(allow_null=True)


class QuotaUseSerializer(serializers.Serializer):
    gpus_in_use = serializers.IntegerField()
    gpus_by_model = ModelUseSerializer(many=True)
    gpu_hours_this_month = serializers.FloatField(help_text="From the allocations held since month_start.")
    month_start = serializers.DateTimeField()


class QuotaChangeSerializer(serializers.Serializer):
    at = serializers.DateTimeField()
    actor = serializers.CharField(source="actor.username", default=None, allow_null=True)
    message = serializers.CharField()
    details = serializers.DictField(help_text="The limits before and after.")


class TeamQuotaSerializer(QuotaLimitsSerializer):
    team = serializers.CharField(help_text="The team's slug.")
    use = QuotaUseSerializer()
    updated_at = serializers.DateTimeField(allow_null=True)
    updated_by = serializers.CharField(allow_null=True)
    changes = QuotaChangeSerializer(many=True, help_text=f"The last {AUDIT_LINES} changes, newest first.")


class TeamQuotaViewSet(viewsets.GenericViewSet):
    """Your teams' quotas (platform admins: every team's); another team is a 404, as everywhere."""

    queryset = Team.objects.none()
    serializer_class = TeamQuotaSerializer

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Team.objects.none()
        return accounts.teams_of(self.request.user).select_related("quota__updated_by")

    @extend_schema(methods=["GET"], responses={200: TeamQuotaSerializer, **ERRORS})
    @extend_schema(
        methods=["PUT", "PATCH"],
        request=QuotaLimitsSerializer,
        responses={200: TeamQuotaSerializer, **ERRORS},
    )
    @action(detail=True, methods=["get", "put", "patch"])
    def quota(self, request, pk=None):
        """The team's quota and use: GPUs in use against the cap (in all and per model) and GPU-hours this
        month against the budget. PUT sets every limit (one left out: no limit), PATCH only those given;
        platform admins only (others: 403), each change recorded in `changes`. A request over the cap
        queues with "over quota" and the figure; one that could never fit it is refused (400)."""
        team = self.get_object()
        if request.method != "GET":
            accounts.check_may_set_quota(request.user, team)
            body = QuotaLimitsSerializer(data=request.data)
            body.is_valid(raise_exception=True)
            current = team.quota.as_json() if hasattr(team, "quota") else {}
            limits = (current if request.method == "PATCH" else {}) | body.validated_data
            accounts.set_team_quota(team, request.user, **limits)
            team = self.get_queryset().get(pk=team.pk)
        view = quotas.quota_views([team])[0]
        changes = team.events.select_related("actor")[:AUDIT_LINES]
        return Response(TeamQuotaSerializer(view.as_json() | {"changes": changes}).data)
