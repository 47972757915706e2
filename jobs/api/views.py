"""Jobs API: submit (JSON, or multipart with a working dir archive), list, inspect, logs, stop, checkpoints."""

from __future__ import annotations

import json
import math
import shutil

from django.shortcuts import get_object_or_404
from django_filters import rest_framework as filters
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.parsers import MultiPartParser
from rest_framework.renderers import BaseRenderer
from rest_framework.response import Response
from rest_framework.settings import api_settings

from inventory.filters import IdFilter
from jobs import goodput, services, workdirs
from jobs import recovery as job_recovery
from jobs.api import serializers as s
from jobs.api.goodput import LedgerSerializer
from jobs.choices import JobStatus
from jobs.models import Job
from voltweb.api.errors import ErrorResponseSerializer
from voltweb.api.parsers import StrictJSONParser
from voltweb.streaming import ThreadedStreamingResponse


class TarRenderer(BaseRenderer):
    """Lets a client ask for the download as `Accept: application/x-tar` (errors still come as JSON bytes)."""

    media_type = "application/x-tar"
    format = "tar"
    charset = None
    render_style = "binary"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return data if isinstance(data, bytes) else json.dumps(data).encode()


ERRORS = {400: ErrorResponseSerializer, 401: ErrorResponseSerializer, 403: ErrorResponseSerializer,
          404: ErrorResponseSerializer, 409: ErrorResponseSerializer}  # fmt: skip
_NUMBERS = ("cluster", "steps", "seed", "checkpoint_every")


def form_payload(data) -> dict:
    """A multipart form as the JSON body it stands for: numbers, booleans and `env` (a JSON object) parsed."""
    payload: dict = {}
    for key in data:
        value = data.get(key)
        if key in _NUMBERS and isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        elif key == "step_sleep" and isinstance(value, str):
            value = _form_number(value)
        elif key == "demo" and isinstance(value, str):
            value = value.strip().lower() in ("1", "true", "on", "yes")
        elif key == "env" and isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else {}
            except ValueError:
                raise ValidationError({"env": ['Must be a JSON object, e.g. {"LR": "0.1"}.']}) from None
        payload[key] = value
    return payload


def _form_number(text: str) -> float | str:
    """A form field's finite decimal number ("" is 0); anything else stays text, for the serializer to refuse
    as JSON's would be ("NaN" and "inf" parse as floats but are not numbers a job can use)."""
    text = text.strip()
    if not text:
        return 0
    try:
        number = float(text)
    except ValueError:
        return text
    return number if math.isfinite(number) else text


def submit_from(serializer: s.JobSubmitSerializer, user) -> Job:
    """Run the service for a validated submission (API and console): unpack the upload, submit, clean up."""
    data = serializer.validated_data
    services.check_may_submit(data["cluster"], user)  # before any upload is unpacked
    staging = workdirs.unpack_upload(data["working_dir"]) if data["working_dir"] is not None else None
    try:
        if data["demo"]:
            return services.submit_job(
                data["cluster"], user,
                services.demo_entrypoint(data["steps"], data["checkpoint_every"], data["seed"], data["step_sleep"]),
                working_dir=workdirs.WORKLOADS_DIR, env=data["env"], checkpoint_every=data["checkpoint_every"],
                name=data["name"] or "demo", is_demo=True,
            )  # fmt: skip
        return services.submit_job(
            data["cluster"], user, data["entrypoint"], working_dir=staging, env=data["env"],
            checkpoint_every=data["checkpoint_every"], name=data["name"],
        )  # fmt: skip
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


class JobFilter(filters.FilterSet):
    """`?cluster=` is an id compared as a number: no "no such cluster" answer that would tell another team's
    cluster ids from missing ones. A whole number within the database's integers (IdFilter), else a 400:
    any decimal was taken, and -3.7e215 overflowed the database driver (a 500)."""

    cluster = IdFilter(field_name="cluster_id")
    status = filters.ChoiceFilter(choices=JobStatus.choices)
    team = filters.CharFilter(field_name="team__slug")

    class Meta:
        model = Job
        fields = ["cluster", "status", "team"]


class JobViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Jobs on your teams' clusters. POST submits one to a READY cluster (202); a worker hands it to Ray.
    Only members of the cluster's team submit (platform admins: 403 `team_members_only`)."""

    serializer_class = s.JobSerializer
    filterset_class = JobFilter
    ordering_fields = ["created_at", "status"]
    parser_classes = [StrictJSONParser, MultiPartParser]
    queryset = Job.objects.none()

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Job.objects.none()
        jobs = services.visible_jobs(self.request.user).select_related("cluster", "team", "created_by")
        return job_recovery.with_gpu_hours_lost(jobs)

    @extend_schema(request={"application/json": s.JobSubmitSerializer, "multipart/form-data": s.JobSubmitSerializer},
                   responses={202: s.JobSerializer, **ERRORS})  # fmt: skip
    def create(self, request, *args, **kwargs):
        data = (
            request.data
            if request.content_type.startswith("application/json")
            else form_payload(request.data)
        )
        serializer = s.JobSubmitSerializer(data=data, context={"request": request})
        serializer.is_valid(raise_exception=True)
        job = submit_from(serializer, request.user)
        return Response(s.JobSerializer(job).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        parameters=[
            OpenApiParameter("offset", int, description="Character offset to read from (0: the start)."),
            OpenApiParameter(
                "limit", int, description=f"At most this many characters ({services.LOG_PAGE_MAX})."
            ),
            OpenApiParameter(
                "readable",
                bool,
                description=(
                    "`1`: the text for people: colour codes stripped, `VOLT_EVENT {...}` lines as sentences "
                    "(`step 120  loss 0.4321`, `checkpoint step 120 saved (2 shards, 1.6 MB)`), whole lines "
                    "only (`offset` moves forward to the first line starting at or after it, `next_offset` "
                    "ends after the last whole line). Offsets still count the stored text: go on from "
                    "`next_offset`. Default `0`: the stored text as the job printed it."
                ),
            ),
        ],
        responses={200: s.JobLogSerializer, **ERRORS},
    )
    @action(detail=True, methods=["get"])
    def logs(self, request, pk=None):
        """The job's stored log from `offset`: follow it by asking again from `next_offset` until `complete`.
        Logs are kept by Volt, so they stay readable after the cluster is gone."""
        job = self.get_object()
        offset = _int_param(request, "offset", 0)
        limit = _int_param(request, "limit", services.LOG_PAGE_MAX)
        readable = _bool_param(request, "readable")
        return Response(services.read_log(job, offset, limit, readable=readable))

    @extend_schema(request=None, responses={202: s.JobSerializer, **ERRORS})
    @action(detail=True, methods=["post"])
    def stop(self, request, pk=None):
        """Stop the job: answers at once; a worker stops it through Ray and makes sure none of its processes
        is left on any host, then it is `stopped`."""
        job = self.get_object()
        job = services.stop_job(job, actor=request.user)
        return Response(s.JobSerializer(job).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses={200: s.CheckpointSerializer(many=True)})
    @action(detail=True, methods=["get"])
    def checkpoints(self, request, pk=None):
        """Checkpoints found on the cluster's shared storage; only `synchronized` ones are resumed from
        (`reason` says what is wrong with the others)."""
        page = self.paginate_queryset(self.get_object().checkpoints.order_by("step"))
        return self.get_paginated_response(s.CheckpointSerializer(page, many=True).data)

    @extend_schema(
        responses={(200, "application/x-tar"): OpenApiTypes.BINARY, **ERRORS},
        parameters=[
            OpenApiParameter("step", int, OpenApiParameter.PATH, description="The checkpoint's step.")
        ],
    )
    @action(detail=True, methods=["get"], url_path=r"checkpoints/(?P<step>[0-9]+)/download",
            url_name="checkpoint-download", renderer_classes=[*api_settings.DEFAULT_RENDERER_CLASSES, TarRenderer])  # fmt: skip
    def checkpoint_download(self, request, pk=None, step=None):
        """A synchronized checkpoint in the checkpoint store as one tar (`step-N/manifest.json`, then every
        shard), streamed from the store; for members of the cluster's team, also after the cluster ended.
        409 `not_downloadable` says why one cannot be (on shared storage, not synchronized)."""
        job = self.get_object()
        checkpoint = get_object_or_404(job.checkpoints, step=int(step) if len(step) <= 9 else -1)
        services.check_may_download(checkpoint, request.user)
        stream = services.checkpoint_archive(checkpoint)
        response = ThreadedStreamingResponse(stream, content_type="application/x-tar")
        response["Content-Disposition"] = f'attachment; filename="{services.archive_name(checkpoint)}"'
        return response

    @extend_schema(responses={200: s.JobEventSerializer(many=True)})
    @action(detail=True, methods=["get"])
    def events(self, request, pk=None):
        page = self.paginate_queryset(self.get_object().events.all())
        return self.get_paginated_response(s.JobEventSerializer(page, many=True).data)

    @extend_schema(responses={200: LedgerSerializer, **ERRORS})
    @action(detail=True, methods=["get"])
    def goodput(self, request, pk=None):
        """Where the job's time went, from submission to its end (or now): productive, queued, start-up
        (`provisioning`), checkpoint_save, recovery and lost_work seconds and GPU-hours; they add up to
        `wall_s` exactly."""
        return Response(goodput.job_ledger(self.get_object()))


def _int_param(request, name: str, default: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    if not raw.isdigit() or len(raw) > 15:
        raise ValidationError(
            {name: [f"Must be a whole number of characters, 0 or more (got {raw[:20]!r})."]}
        )
    return int(raw)


def _bool_param(request, name: str) -> bool:
    raw = request.query_params.get(name, "").strip().lower()
    if raw in ("", "0", "false", "no"):
        return False
    if raw in ("1", "true", "yes"):
        return True
    raise ValidationError({name: [f"Must be 1 or 0 (got {raw[:20]!r})."]})
