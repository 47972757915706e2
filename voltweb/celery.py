"""The Celery application. Queues: placement, provisioning, monitoring, jobs (DESIGN.md "Processes")."""

import os

from celery import Celery
from kombu import Exchange, Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "voltweb.settings")

app = Celery("volt")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_queues = [
    Queue(name, Exchange(name, type="direct"), routing_key=name)
    for name in ("placement", "provisioning", "monitoring", "jobs")
]
# Tasks name their queue in voltweb.taskutils.volt_task; jobs' are routed here too, by module.
app.conf.task_routes = {"jobs.tasks.*": {"queue": "jobs"}}
app.autodiscover_tasks()


def register_periodic_tasks() -> None:
    """All periodic work is registered here, in one place (CONVENTIONS.md "Background work")."""
    from voltweb.periodic import SCHEDULE

    app.conf.beat_schedule = SCHEDULE


register_periodic_tasks()
