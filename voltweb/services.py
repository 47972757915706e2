"""Account operations: tokens, teams, roles. Other apps call these, never the models' internals."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from voltweb.choices import TeamRole
from voltweb.domain import DomainError
from voltweb.models import ApiToken, Membership, Team, TeamEvent, TeamQuota
from voltweb.taskutils import enqueue_on_commit

TOKEN_PREFIX = "volt_"


def hash_token(raw: str) -> str:
    # Tokens are 256-bit random strings, so a plain SHA-256 is enough (no dictionary to attack).
    return hashlib.sha256(raw.encode()).hexdigest()


@dataclass(frozen=True)
class IssuedToken:
    token: ApiToken
    secret: str = field(repr=False)  # never in a log line or an error report


def default_token_expiry():
    """When a token created now expires unless asked to expire sooner (VOLT_TOKEN_LIFETIME_DAYS)."""
    return timezone.now() + timedelta(days=settings.VOLT_TOKEN_LIFETIME_DAYS)


class TokenExpiryRefused(ValueError):
    """An `expires_at` a token may not have; the message names what is allowed (API: 400 on the field)."""


def check_token_expiry(expires_at) -> None:
    """Raise TokenExpiryRefused unless `expires_at` lies between now and the lifetime's end."""
    latest = default_token_expiry()
    if expires_at <= timezone.now():
        raise TokenExpiryRefused("Give a time in the future (or leave empty for the default).")
    if expires_at > latest:
        raise TokenExpiryRefused(
            f"may be at most {settings.VOLT_TOKEN_LIFETIME_DAYS} days ahead (VOLT_TOKEN_LIFETIME_DAYS): "
            f"{latest:%Y-%m-%d %H:%M} UTC at the latest (or leave empty for that)."
        )


def create_api_token(user: AbstractBaseUser, name: str, expires_at=None) -> IssuedToken:
    """Create a token for `user`. The returned secret is the only copy: show it once.

    Tokens expire: at `expires_at` if given (within the lifetime, else TokenExpiryRefused), else after the
    default lifetime. Callers must have authenticated with a session (or be an operator's command): a token
    never mints tokens.
    """
    if expires_at is not None:
        check_token_expiry(expires_at)
    expires_at = expires_at or default_token_expiry()
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        user=user,
        name=name.strip() or "token",
        prefix=secret[: len(TOKEN_PREFIX) + 6],
        token_hash=hash_token(secret),
        expires_at=expires_at,
    )
    return IssuedToken(token=token, secret=secret)


def revoke_api_token(token: ApiToken) -> ApiToken:
    """Revoke a token; idempotent (a revoked token keeps its first revocation time)."""
    ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
    token.refresh_from_db()
    return token


def authenticate_token(raw: str) -> ApiToken | None:
    """The active token matching `raw`, with its use recorded, or None."""
    if not raw.startswith(TOKEN_PREFIX):
        return None
    token = ApiToken.objects.select_related("user").filter(token_hash=hash_token(raw)).first()
    if token is None or not token.is_active or not token.user.is_active:
        return None
    now = timezone.now()
    # Record use at most once a minute: a busy CI token should not write on every request.
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


def socket_user(user_pk: int, token_id: int | None) -> AbstractBaseUser | None:
    """The user a live websocket acts for, read afresh: None once the account is deactivated or, for a
    socket opened with an API token (`token_id`), once that token is revoked or expired."""
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.filter(pk=user_pk, is_active=True).first()
    if user is None or token_id is None:
        return user
    token = ApiToken.objects.filter(pk=token_id, user=user, revoked_at__isnull=True)
    return user if token.exclude(expires_at__lte=timezone.now()).exists() else None


def teams_of(user: AbstractBaseUser) -> QuerySet[Team]:
    if not user.is_authenticated:
        return Team.objects.none()
    if is_platform_admin(user):
        return Team.objects.all()
    return Team.objects.filter(memberships__user=user)


def is_platform_admin(user: AbstractBaseUser) -> bool:
    return bool(user.is_authenticated and user.is_staff)


def is_team_member(user: AbstractBaseUser, team: Team) -> bool:
    """A member of `team` in any role. Platform admins are not members by their flag alone."""
    return bool(user.is_authenticated and Membership.objects.filter(team=team, user=user).exists())


def is_team_admin(user: AbstractBaseUser, team: Team) -> bool:
    if is_platform_admin(user):
        return True
    return Membership.objects.filter(team=team, user=user, role=TeamRole.ADMIN).exists()


def roles_for(user: AbstractBaseUser) -> dict:
    """What the console navigation shows this user."""
    memberships = list(Membership.objects.filter(user=user).select_related("team"))
    return {
        "platform_admin": is_platform_admin(user),
        "teams": [m.team for m in memberships],
        "team_admin": any(m.role == TeamRole.ADMIN for m in memberships),
        "researcher": bool(memberships),
    }


@transaction.atomic
def create_team(name: str, slug: str, admin: AbstractBaseUser | None = None) -> Team:
    team, _ = Team.objects.get_or_create(slug=slug, defaults={"name": name})
    if admin is not None:
        Membership.objects.get_or_create(team=team, user=admin, defaults={"role": TeamRole.ADMIN})
    return team


def add_member(team: Team, user: AbstractBaseUser, role: str = TeamRole.RESEARCHER) -> Membership:
    membership, created = Membership.objects.get_or_create(team=team, user=user, defaults={"role": role})
    if not created and membership.role != role:
        membership.role = role
        membership.save(update_fields=["role"])
    return membership


# --- quotas (issue 28 item 3: placement enforces them in clusters/quotas.py) ------------------------------


class QuotaAdminsOnly(DomainError):
    """Only platform admins set a team's quota (team admins and researchers ask one)."""

    code = "platform_admins_only"
    status = 403


class QuotaInvalid(DomainError, ValueError):
    """A quota value that cannot be a limit (negative, not a whole number, a nameless model)."""

    code = "invalid"
    status = 400


def check_may_set_quota(user: AbstractBaseUser, team: Team) -> None:
    """Raise QuotaAdminsOnly unless `user` is a platform admin."""
    if not is_platform_admin(user):
        raise QuotaAdminsOnly(f"Only platform admins set team quotas; ask one to change {team.name}'s quota.")


def note_team(team: Team, message: str, *, actor: AbstractBaseUser | None = None, details=None) -> TeamEvent:
    """A line of the team's audit trail; the only writer of TeamEvent."""
    return TeamEvent.objects.create(team=team, actor=actor, message=message, details=details or {})


def _limit(value, what: str) -> int | None:
    if value in (None, ""):
        return None
    if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).strip().isdigit():
        raise QuotaInvalid(
            f"{what} must be a whole number of 0 or more, or empty for no limit (got {value!r})."
        )
    return int(value)


def _model_caps(caps) -> dict[str, int]:
    if not isinstance(caps, dict):
        raise QuotaInvalid('Per-model caps are a mapping of GPU model to GPUs, e.g. {"H100": 8}.')
    cleaned: dict[str, int] = {}
    for name, cap in caps.items():
        model = " ".join(str(name).split())
        if not model or len(model) > 50:
            raise QuotaInvalid(f"A per-model cap needs a GPU model name of 1-50 characters (got {name!r}).")
        if model.upper() in {m.upper() for m in cleaned}:
            raise QuotaInvalid(f"GPU model {model!r} is capped twice; give one cap per model.")
        cleaned[model] = _limit(cap, f"The cap for {model}")
        if cleaned[model] is None:
            del cleaned[model]  # an empty cap is no cap
    return cleaned


def _describe_change(before: dict, after: dict) -> str:
    def shown(value) -> str:
        return "no limit" if value is None else str(value)

    parts = []
    if before["max_gpus"] != after["max_gpus"]:
        parts.append(f"GPUs in use {shown(before['max_gpus'])} -> {shown(after['max_gpus'])}")
    for model in sorted(set(before["gpu_model_caps"]) | set(after["gpu_model_caps"])):
        old, new = before["gpu_model_caps"].get(model), after["gpu_model_caps"].get(model)
        if old != new:
            parts.append(f"{model} GPUs {shown(old)} -> {shown(new)}")
    if before["gpu_hours_per_month"] != after["gpu_hours_per_month"]:
        old, new = before["gpu_hours_per_month"], after["gpu_hours_per_month"]
        parts.append(f"GPU-hours per month {shown(old)} -> {shown(new)}")
    return "; ".join(parts)


def set_team_quota(
    team: Team,
    actor: AbstractBaseUser,
    *,
    max_gpus=None,
    gpu_model_caps=None,
    gpu_hours_per_month=None,
) -> TeamQuota:
    """Set the team's quota (every limit given: None is no limit), audited on the team's trail.

    Platform admins only (QuotaAdminsOnly); values are checked (QuotaInvalid). A change that changes
    nothing writes nothing. The queue is drained after commit: a raised cap starts what waited for it.
    """
    check_may_set_quota(actor, team)
    after = {
        "max_gpus": _limit(max_gpus, "The GPU cap"),
        "gpu_model_caps": _model_caps(gpu_model_caps or {}),
        "gpu_hours_per_month": _limit(gpu_hours_per_month, "The monthly GPU-hour budget"),
    }
    with transaction.atomic():
        # The row lock placement takes too (clusters.quotas.admit): a change waits for a placement under way.
        quota, _ = TeamQuota.objects.get_or_create(team=team)
        quota = TeamQuota.objects.select_for_update().get(pk=quota.pk)
        before = quota.as_json()
        change = _describe_change(before, after)
        if not change:
            return quota
        for name, value in after.items():
            setattr(quota, name, value)
        quota.updated_at, quota.updated_by = timezone.now(), actor
        quota.save()
        note_team(
            team,
            f"quota changed by {actor.get_username()}: {change}",
            actor=actor,
            details={"before": before, "after": after},
        )
        enqueue_on_commit("clusters.tasks.drain_queue_task")
    return quota
