"""Deployment checks (`manage.py check --deploy`): what a production install must not run without.

DESIGN.md "Security": jobs are hostile code. Where a job could reach Volt's database or Redis (a worker
and a host on one network, a misplaced firewall), a password is the last wall: Redis without one takes
any Celery message (Volt's worker runs it) and answers every channel; PostgreSQL without one is whoever
asks.
"""

from __future__ import annotations

from urllib.parse import urlparse

from django.conf import settings
from django.core.checks import Tags, Warning, register


@register(Tags.security, deploy=True)
def service_passwords(app_configs, **kwargs) -> list[Warning]:
    """Redis and PostgreSQL URLs carry credentials in production."""
    problems = []
    for name in ("REDIS_URL", "CELERY_BROKER_URL"):
        url = getattr(settings, name, "")
        parsed = urlparse(url)
        if parsed.scheme in ("redis", "rediss") and not parsed.password:
            problems.append(
                Warning(
                    f"{name} has no password: any process that reaches this Redis can read every channel and "
                    "queue a task that Volt's workers run.",
                    hint="Give Redis an ACL user for Volt (ACL SETUSER volt on >PASSWORD ~* &* +@all; "
                    "ACL SETUSER default off) and set "
                    f"{name}=redis://volt:PASSWORD@host:6379/0 (rediss:// across machines).",
                    id="volt.W001",
                )
            )
            break
    database = settings.DATABASES["default"]
    if "postgresql" in database["ENGINE"] and not database.get("PASSWORD"):
        problems.append(
            Warning(
                "DATABASE_URL has no password: PostgreSQL must not trust whoever connects.",
                hint="Create a role with a password for Volt, use scram-sha-256 in pg_hba.conf and set "
                "DATABASE_URL=postgres://volt:PASSWORD@host:5432/volt.",
                id="volt.W002",
            )
        )
    return problems
