"""Training jobs on clusters: the job, its timeline, its stored logs and the checkpoints found for it."""

from __future__ import annotations

import json

from django.conf import settings
from django.db import models
from django.utils import timezone

from clusters.models import Cluster
from jobs.choices import JobStatus
from voltweb import crypto
from voltweb.models import Team


class Job(models.Model):
    """One training job submitted to a cluster through Ray's job submission API (jobs/services.py).

    A resubmission (recovery) is a new `attempt` of the same row: a new Ray submission, same logs and
    checkpoints folder.
    """

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="jobs")
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="jobs")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    name = models.CharField(max_length=100)
    entrypoint = models.TextField(help_text="Shell command Ray runs in the job's working dir.")
    env_encrypted = models.TextField(
        blank=True, help_text="The caller's environment variables: JSON, Fernet-encrypted at rest (`env`)."
    )
    checkpoint_every = models.PositiveIntegerField(default=10, help_text="Steps between checkpoints.")
    is_demo = models.BooleanField(default=False, help_text="The demo workload shipped with Volt.")
    working_dir = models.CharField(
        max_length=500, blank=True, help_text="Folder on Volt's side shipped to the cluster with the job."
    )
    status = models.CharField(max_length=20, choices=JobStatus.choices, default=JobStatus.PENDING)
    status_reason = models.TextField(blank=True)
    ray_submission_id = models.CharField(max_length=120, blank=True)
    attempt = models.PositiveIntegerField(default=1)
    resume_from = models.CharField(max_length=500, blank=True, help_text="VOLT_RESUME_FROM of this attempt.")
    created_at = models.DateTimeField(default=timezone.now)
    submitted_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    first_step_at = models.DateTimeField(null=True, blank=True, help_text="First training step logged.")
    last_step = models.IntegerField(null=True, blank=True)
    # This attempt's step events (jobs.services.apply_events): {"first": [step, time], "last": [step, time],
    # "previous": the step logged before the last}; reset by a resubmission. Recovery reads when training
    # stepped again, the mean step time and whether "steps lost" is exact from it (jobs/recovery.py).
    attempt_steps = models.JSONField(default=dict, blank=True)
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    result = models.JSONField(default=dict, blank=True, help_text="The workload's `done` event.")
    # Log bookkeeping: characters stored in JobLogChunk rows, and bytes read of the current Ray submission's
    # log (its driver log file on the head host).
    log_size = models.PositiveBigIntegerField(default=0)
    ray_log_seen = models.PositiveBigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["status"], name="job_status_idx")]

    def __str__(self) -> str:
        return f"job {self.pk} {self.name} ({self.status})"

    # A job's environment often carries the team's credentials (a dataset token, a tracker key): encrypted at
    # rest like the other secrets (voltweb/crypto.py), so a copy of the database does not give them away.
    @property
    def env(self) -> dict[str, str]:
        return json.loads(crypto.decrypt(self.env_encrypted)) if self.env_encrypted else {}

    @env.setter
    def env(self, value: dict[str, str]) -> None:
        self.env_encrypted = crypto.encrypt(json.dumps(dict(value or {}), sort_keys=True)) if value else ""

    # The contract's names (JOBS_CONTRACT.md) for the timestamps.
    @property
    def created(self):
        return self.created_at

    @property
    def started(self):
        return self.started_at

    @property
    def finished(self):
        return self.finished_at


class JobEvent(models.Model):
    """A line of a job's timeline: every status change with its reason, and notable moments."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(default=timezone.now)
    from_status = models.CharField(max_length=20, blank=True)
    to_status = models.CharField(max_length=20, blank=True)
    message = models.TextField(blank=True)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"job {self.job_id}: {self.from_status} -> {self.to_status}"


class JobLogChunk(models.Model):
    """A piece of a job's log as polled from Ray, kept so logs outlive the cluster. `offset` is the
    position (characters) of its first character in the job's whole log, every attempt after the other."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="log_chunks")
    offset = models.PositiveBigIntegerField()
    attempt = models.PositiveIntegerField(default=1)
    text = models.TextField()

    class Meta:
        ordering = ["job_id", "offset"]
        constraints = [models.UniqueConstraint(fields=["job", "offset"], name="joblog_one_chunk_per_offset")]

    def __str__(self) -> str:
        return f"job {self.job_id} log @{self.offset} ({len(self.text)} chars)"


class Checkpoint(models.Model):
    """A `step-*` folder found in the job's checkpoint dir; only synchronized ones are resumed from."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="checkpoints")
    step = models.IntegerField()
    path = models.CharField(max_length=500)
    size_bytes = models.PositiveBigIntegerField(default=0)
    created = models.DateTimeField(null=True, blank=True, help_text="The manifest's time.")
    synchronized = models.BooleanField(default=False)
    reason = models.TextField(blank=True, help_text="Why it is not synchronized.")
    world_size = models.PositiveIntegerField(null=True, blank=True)
    save_s = models.FloatField(
        null=True, blank=True, help_text="How long writing it held training (the manifest's), seconds."
    )
    discovered_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["job_id", "step"]
        constraints = [models.UniqueConstraint(fields=["job", "path"], name="checkpoint_one_row_per_path")]

    def __str__(self) -> str:
        return f"job {self.job_id} step {self.step} ({'synchronized' if self.synchronized else self.reason})"
