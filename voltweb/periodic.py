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
    "drain-placement-queue": {
        "task": "clusters.tasks.drain_queue_task",
        "schedule": 30.0,
        "options": {"queue": "placement"},
    },
    "reap-stuck-placing": {
        "task": "clusters.tasks.reap_stuck_placing",
        "schedule": 60.0,
        "options": {"queue": "placement"},
    },
    "reap-stuck-provisioning": {
        "task": "clusters.tasks.reap_stuck_provisioning",
        "schedule": 60.0,
        "options": {"queue": "monitoring"},
    },
}
