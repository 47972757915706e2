"""Every periodic task Volt runs, in one table. Celery beat reads it through voltweb.celery."""

from voltweb.env import env_float

# Read from the environment like settings.VOLT_WATCH_INTERVAL_S (this table loads before Django's settings).
WATCH_INTERVAL_S = env_float("VOLT_WATCH_INTERVAL_S", 5.0, minimum=1.0, maximum=3600.0)
RECOVERY_RETRY_S = env_float("VOLT_RECOVERY_RETRY_S", 15.0, minimum=1.0, maximum=3600.0)
JOB_POLL_S = env_float("VOLT_JOB_POLL_S", 2.0, minimum=0.5, maximum=600.0)

SCHEDULE = {
    "reap-stuck-onboarding": {
        "task": "inventory.tasks.reap_stuck_onboarding",
        "schedule": 60.0,
        "options": {"queue": "monitoring"},
    },
    "refresh-host-runtimes": {  # SSH hosts whose runtime is not of Volt's current pins, when idle
        "task": "inventory.tasks.refresh_runtimes",
        "schedule": 300.0,
        "options": {"queue": "monitoring"},
    },
    "recheck-reachability": {  # who reaches whom directly, older than VOLT_REACHABILITY_RECHECK_S
        "task": "inventory.tasks.recheck_reachability",
        "schedule": 300.0,
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
    "expire-clusters": {  # requested durations: warn near the end, terminate at it
        "task": "clusters.tasks.expire_clusters_task",
        "schedule": 30.0,
        "options": {"queue": "placement", "expires": 30.0},
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
    "reap-cluster-leftovers": {  # ended clusters' Unix users, hosts not yet cleaned, drills not yet ended
        "task": "clusters.tasks.reap_cluster_leftovers",
        "schedule": 60.0,
        "options": {"queue": "monitoring"},
    },
    "watch-clusters": {
        "task": "clusters.tasks.watch_clusters_task",
        "schedule": WATCH_INTERVAL_S,
        "options": {"queue": "monitoring", "expires": WATCH_INTERVAL_S},
    },
    "compact-metrics": {
        "task": "clusters.tasks.compact_metrics_task",
        "schedule": 300.0,
        "options": {"queue": "monitoring"},
    },
    "retry-recoveries": {  # waiting recoveries (no capacity), stalled ones, DEGRADED clusters not yet recovering
        "task": "clusters.tasks.retry_recoveries_task",
        "schedule": RECOVERY_RETRY_S,
        "options": {"queue": "monitoring", "expires": RECOVERY_RETRY_S},
    },
    "probe-idle-clusters": {
        "task": "clusters.tasks.probe_idle_clusters_task",
        "schedule": 60.0,
        "options": {"queue": "monitoring"},
    },
    "poll-jobs": {
        "task": "jobs.tasks.poll_jobs_task",
        "schedule": JOB_POLL_S,
        "options": {"queue": "jobs", "expires": JOB_POLL_S},
    },
}
