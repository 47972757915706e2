from rest_framework import serializers

from clusters.models import Cluster
from jobs import recovery, services
from jobs.models import Checkpoint, Job, JobEvent
from voltweb.api.fields import ScopedIdField, StrictCharField, StrictFloatField, StrictIntegerField


class JobSubmitSerializer(serializers.Serializer):
    """A job to run on a READY cluster: the demo workload, or your entrypoint (with an uploaded working dir
    as multipart form data). JSON bodies take no file."""

    cluster = ScopedIdField(
        scope=Cluster.objects.visible_to, noun="cluster", queryset=Cluster.objects.all(),
        help_text="Id of one of your teams' READY clusters.",
    )  # fmt: skip
    name = StrictCharField(max_length=100, required=False, allow_blank=True, default="")
    demo = serializers.BooleanField(default=False, help_text="Run the demo workload shipped with Volt.")
    steps = StrictIntegerField(min_value=1, max_value=100000, default=60, help_text="Demo: training steps.")
    seed = StrictIntegerField(
        min_value=0, max_value=2**31 - 1, default=0, help_text="Demo: data and init seed."
    )
    step_sleep = StrictFloatField(
        min_value=0, max_value=10, default=0, help_text="Demo: seconds to sleep per step (to watch it)."
    )
    entrypoint = StrictCharField(
        max_length=services.MAX_ENTRYPOINT, required=False, allow_blank=True, default="",
        help_text="Command run in the working dir, e.g. `python train.py --lr 0.1` (not with demo).",
    )  # fmt: skip
    env = serializers.DictField(
        child=serializers.JSONField(), required=False, default=dict,
        help_text='Environment variables, e.g. {"LR": "0.1"} (VOLT_* and RAY_* are Volt\'s and Ray\'s).',
    )  # fmt: skip
    checkpoint_every = StrictIntegerField(min_value=1, max_value=1_000_000, default=10)
    working_dir = serializers.FileField(
        required=False, allow_null=True, default=None,
        help_text="A .zip or .tar.gz of the job's folder (multipart only; at most VOLT_JOB_UPLOAD_MAX_MB).",
    )  # fmt: skip

    def to_internal_value(self, data):
        """Unknown fields are refused, each named (a misspelt `stepz` used to be ignored, the default run)."""
        unknown = sorted(set(data) - set(self.fields)) if hasattr(data, "keys") else []
        if unknown:
            accepted = f"Unknown field; this endpoint takes {', '.join(self.fields)}."
            raise serializers.ValidationError({str(name)[:100]: [accepted] for name in unknown})
        return super().to_internal_value(data)

    def validate_env(self, env):
        try:
            return services.validate_env(env)
        except services.JobInputError as exc:  # the field is named by the error's shape already
            raise serializers.ValidationError(str(exc).removeprefix("env: ")) from None

    def validate(self, data):
        if data["demo"] and (data["entrypoint"] or data["working_dir"] is not None):
            raise serializers.ValidationError(
                {"entrypoint": ["Give either demo: true or an entrypoint (with its working_dir), not both."]}
            )
        if not data["demo"] and not data["entrypoint"].strip():
            raise serializers.ValidationError(
                {"entrypoint": ["Give the command to run (e.g. `python train.py`), or demo: true."]}
            )
        return data


class JobSerializer(serializers.ModelSerializer):
    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    created_by = serializers.CharField(source="created_by.username", default=None, read_only=True)
    gpu_hours_lost = serializers.SerializerMethodField(
        help_text="GPU-hours lost to node failures (recoveries)."
    )
    step_reached_before = serializers.SerializerMethodField(
        help_text="The highest step an earlier attempt reached (null on a first attempt): a resubmitted job "
        "restarts from its checkpoint's step, so `last_step` says where it is now."
    )
    env = serializers.DictField(
        child=serializers.CharField(), read_only=True, help_text="The caller's environment variables."
    )

    class Meta:
        model = Job
        fields = [
            "id", "name", "cluster", "cluster_name", "team", "created_by", "status", "status_reason",
            "entrypoint", "env", "checkpoint_every", "is_demo", "attempt", "resume_from",
            "ray_submission_id", "created_at", "submitted_at", "started_at", "finished_at",
            "first_step_at", "last_step", "step_reached_before", "stop_requested_at", "result", "log_size",
            "gpu_hours_lost",
        ]  # fmt: skip
        read_only_fields = fields

    def get_gpu_hours_lost(self, job) -> float:
        return recovery.gpu_hours_lost(job)

    def get_step_reached_before(self, job) -> int | None:
        return recovery.step_reached_before(job)


class JobEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["at", "from_status", "to_status", "message"]


class CheckpointSerializer(serializers.ModelSerializer):
    location = serializers.SerializerMethodField(
        help_text="Where it is: its `s3://` place in the checkpoint store, or a folder on the cluster's shared "
        "storage as the cluster's connect box names it."
    )
    download = serializers.SerializerMethodField(
        help_text="GET it for a tar of the manifest and the shards (team members; synchronized checkpoints in "
        "the store only, also after the cluster ended); null when it cannot be downloaded."
    )

    class Meta:
        model = Checkpoint
        fields = [
            "step",
            "path",
            "location",
            "download",
            "size_bytes",
            "created",
            "synchronized",
            "reason",
            "world_size",
            "discovered_at",
        ]

    def get_location(self, obj) -> str:
        return services.checkpoint_location(obj)

    def get_download(self, obj) -> str | None:
        return services.download_url(obj)


class JobLogSerializer(serializers.Serializer):
    offset = serializers.IntegerField(
        help_text="Where `text` starts in the stored log (with `readable=1`: the first whole line from there)."
    )
    next_offset = serializers.IntegerField(help_text="Ask again from here for what follows.")
    size = serializers.IntegerField(help_text="Characters stored so far.")
    text = serializers.CharField(
        allow_blank=True,
        help_text="The stored text, or with `readable=1` the same lines rendered for people.",
    )
    complete = serializers.BooleanField(help_text="The job ended and this answer reaches the end of its log.")
    status = serializers.CharField()
