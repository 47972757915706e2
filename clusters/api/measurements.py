"""Bandwidth samples API: a provider uploads nccl-tests all_reduce_perf output measured on its own hosts."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.response import Response

from clusters.models import BandwidthSample
from clusters.telemetry import measurements
from voltweb.api.errors import ErrorResponseSerializer, ServiceError

ERRORS = {code: ErrorResponseSerializer for code in (400, 401, 403)}


class ProviderRunSerializer(serializers.Serializer):
    hosts = serializers.ListField(
        child=serializers.IntegerField(min_value=1),
        min_length=1,
        max_length=measurements.MAX_HOSTS,
        help_text="Ids of the hosts the run used: one machine for a single-node run, each node otherwise.",
    )
    output = serializers.CharField(
        trim_whitespace=False,
        help_text="all_reduce_perf's output as it printed it: the '# nThread' header, the '# Rank' device "
        "lines, the out-of-place / in-place table, '# Out of bounds values' and '# Avg bus bandwidth'.",
    )


class BandwidthSampleSerializer(serializers.ModelSerializer):
    class Meta:
        model = BandwidthSample
        fields = [
            "id",
            "level",
            "domain_id",
            "busbw_gbps",
            "predicted_gbps",
            "nodes",
            "source",
            "measured_at",
            "details",
        ]
        read_only_fields = fields


class BandwidthSampleViewSet(mixins.CreateModelMixin, viewsets.GenericViewSet):
    """Measured figures from outside Volt (issue 23): POST all_reduce_perf output for a set of hosts."""

    serializer_class = ProviderRunSerializer
    queryset = BandwidthSample.objects.none()

    @extend_schema(request=ProviderRunSerializer, responses={201: BandwidthSampleSerializer, **ERRORS})
    def create(self, request, *args, **kwargs):
        """Keep a provider's own all-reduce measurement of its hosts, "measured by the provider": the busbw
        at the largest message size, for the domain the hosts span (one host: the host). Output Volt cannot
        read — truncated, another collective, a failed check — is refused naming the line."""
        if not measurements.may_upload(request.user):
            raise ServiceError(
                "Only a provider admin of the hosts' provider, or a platform admin, uploads measured figures.",
                code="not_allowed",
                status_code=403,
            )
        upload = ProviderRunSerializer(data=request.data)
        upload.is_valid(raise_exception=True)
        sample = measurements.record_provider_run(
            request.user, upload.validated_data["hosts"], upload.validated_data["output"]
        )
        return Response(BandwidthSampleSerializer(sample).data, status=status.HTTP_201_CREATED)
