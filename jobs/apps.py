from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"

    def ready(self) -> None:
        # Clusters know nothing of jobs (dependencies point jobs -> clusters): jobs register here what
        # must happen to them when their cluster is terminated or degrades.
        from clusters import hooks
        from jobs import services

        hooks.on_before_teardown(services.stop_cluster_jobs)
        hooks.on_status_change(services.cluster_status_changed)
        # Automatic recovery (clusters/recovery.py) stops what is left of the jobs, then resumes them.
        from clusters import recovery as cluster_recovery
        from jobs import recovery

        cluster_recovery.register_hook(recovery.HOOK)
