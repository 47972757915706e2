"""Accounts: teams, their members, and the API tokens people and CI pipelines use."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from voltweb.choices import TeamRole


class Team(models.Model):
    """A group of researchers that owns clusters and jobs; the unit of visibility in the API."""

    name = models.CharField(max_length=100, unique=True)
    slug = models.SlugField(max_length=100, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, through="Membership", related_name="teams")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    """A user's role in one team."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=20, choices=TeamRole.choices, default=TeamRole.RESEARCHER)
    joined_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team", "user"], name="membership_unique_user_per_team")
        ]
        ordering = ["team__name", "user__username"]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


class ApiToken(models.Model):
    """A revocable bearer token. Only a SHA-256 of the secret is stored; the secret is shown once."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, help_text="First characters of the token, to recognise it.")
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        if self.revoked_at is not None:
            return False
        return self.expires_at is None or self.expires_at > timezone.now()


class TeamQuota(models.Model):
    """What a team may hold at once and use per month (Kueue's nominal quota); set by platform admins.

    Every limit is optional (empty: no limit). `gpu_model_caps` caps GPUs in use per model name; a family
    name ("H100") caps every variant it matches, as placement matches requests. Placement enforces it under
    this row's lock (clusters/quotas.py); `voltweb.services.set_team_quota` is its only writer (audited).
    """

    team = models.OneToOneField(Team, on_delete=models.CASCADE, related_name="quota")
    max_gpus = models.PositiveIntegerField(
        null=True, blank=True, help_text="GPUs the team's clusters may hold at once; empty: no cap."
    )
    gpu_model_caps = models.JSONField(
        default=dict,
        blank=True,
        help_text='GPUs in use per model, e.g. {"H100": 8}; a model not named: no cap.',
    )
    gpu_hours_per_month = models.PositiveIntegerField(
        null=True, blank=True, help_text="GPU-hours per calendar month (UTC); empty: no budget."
    )
    updated_at = models.DateTimeField(default=timezone.now)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    def __str__(self) -> str:
        return f"quota of {self.team}"

    @property
    def is_unlimited(self) -> bool:
        return self.max_gpus is None and not self.gpu_model_caps and self.gpu_hours_per_month is None

    def as_json(self) -> dict:
        return {
            "max_gpus": self.max_gpus,
            "gpu_model_caps": dict(self.gpu_model_caps or {}),
            "gpu_hours_per_month": self.gpu_hours_per_month,
        }


class TeamEvent(models.Model):
    """A line of a team's audit trail: who changed what about the team (its quota), and when.

    `details` holds the change itself ({"before": ..., "after": ...}). Written only by
    `voltweb.services.note_team`.
    """

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(default=timezone.now)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    message = models.TextField()
    details = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["team", "-at"], name="teamevent_team_at_idx")]

    def __str__(self) -> str:
        return f"{self.team_id} {self.at:%Y-%m-%d %H:%M}: {self.message}"
