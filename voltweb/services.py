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
from voltweb.models import ApiToken, Membership, Team

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
