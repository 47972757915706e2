"""Every periodic task Volt runs, in one table. Celery beat reads it through voltweb.celery."""

SCHEDULE = {
    "reap-stuck-onboarding": {
        "task": "inventory.tasks.reap_stuck_onboarding",
        "schedule": 60.0,
        "options": {"queue": "monitoring"},
    },
    "host-health-sweep": {
        "task": "inventory.tasks.health_sweep",
        "schedule": 120.0,
        "options": {"queue": "monitoring"},
    },
}
