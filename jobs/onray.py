"""What a job gets on its cluster: its Ray submission id and process marker, its nodes, its checkpoint
folder, its runtime env, the Ray job client with the cluster's token. Below submitting, following and
stopping, which all reach the cluster through here."""

from __future__ import annotations

import logging

from clusters import checkpoint_store
from clusters.models import Cluster, ClusterNode
from clusters.provisioning import ray_http, ray_nodes
from clusters.telemetry import ray_head
from clusters.tenancy import (
    ray_auth_token,
    ray_cluster_id,
    shared_storage_dir,
    storage_location,
)
from inventory.choices import DriverKind
from jobs.choices import JobStatus
from jobs.models import Job
from voltweb import namespace
from voltweb.taskutils import enqueue_on_commit

logger = logging.getLogger(__name__)
S = JobStatus


def submission_id(job: Job, attempt: int | None = None) -> str:
    """Ray's submission id for one attempt: unique per install, so a redelivered submit finds its job."""
    return f"volt-{namespace.current_id()}-job-{job.pk}-a{attempt or job.attempt}"


def job_marker(job: Job) -> str:
    """VOLT_JOB_MARKER: every process of the job carries it (ray_nodes.job_processes finds them by it)."""
    return f"{ray_cluster_id(job.cluster)}/job-{job.pk}"


def on_local_hosts(cluster: Cluster) -> bool:
    head = live_nodes(cluster)[:1]
    return bool(head) and head[0].host.driver == DriverKind.LOCAL


def live_nodes(cluster: Cluster) -> list[ClusterNode]:
    return list(
        cluster.nodes.active()
        .filter(slot__isnull=False)
        .select_related("host__provider")
        .order_by("-is_head", "rank")
    )


def checkpoint_dir(job: Job) -> str:
    """`s3://<bucket>/clusters/<name>/jobs/<id>/checkpoints` when the cluster has a place in the checkpoint
    store; else `<storage>/jobs/<id>/checkpoints` on the cluster's shared storage (local hosts: this machine's
    folder; ssh hosts: under the cluster's workdir, ${HOME} expanded by Ray)."""
    cluster = job.cluster
    if cluster.store_access_key:
        return checkpoint_store.checkpoint_root(cluster, "jobs", job.pk, "checkpoints")
    if on_local_hosts(cluster):
        return str(shared_storage_dir(cluster) / "jobs" / str(job.pk) / "checkpoints")
    return storage_location(cluster, "jobs", job.pk, "checkpoints").replace("~", "${HOME}", 1)


def shown_path(job: Job, path: str) -> str:
    """A path in the job's checkpoint dir as people see it (the connect box's `~/volt/clusters/…/storage`),
    never this machine's folder behind a local cluster's storage link; any other path as it is."""
    inside = checkpoint_dir(job).rstrip("/") + "/"
    if path.startswith(inside) and not path.startswith("s3://"):  # the store's places are shown as they are
        return storage_location(job.cluster, "jobs", job.pk, "checkpoints", path[len(inside) :])
    return path


def runtime_env(job: Job) -> dict:
    """The Ray runtime_env of the job's current attempt (JOBS_CONTRACT.md's environment)."""
    env = {
        **job.env,
        "VOLT_JOB_ID": str(job.pk),
        "VOLT_CHECKPOINT_DIR": checkpoint_dir(job),
        "VOLT_CHECKPOINT_EVERY": str(job.checkpoint_every),
        "VOLT_NUM_NODES": str(len(live_nodes(job.cluster)) or 1),
        **checkpoint_store.job_environment(job.cluster),
        ray_nodes.JOB_MARKER_VAR: job_marker(job),
    }
    if job.resume_from:
        env["VOLT_RESUME_FROM"] = job.resume_from
    if on_local_hosts(job.cluster):
        env["GLOO_SOCKET_IFNAME"] = "lo"
    return {"working_dir": job.working_dir, "excludes": ["__pycache__"], "env_vars": env}


def ray_client(cluster: Cluster):
    """Ray's job submission client for the cluster's head, with its token on every request."""
    from ray.job_submission import JobSubmissionClient  # heavy import: only in workers, when used

    try:
        url = ray_head.dashboard_for(cluster)
    except ray_head.HeadUnreachable as exc:
        raise ConnectionError(str(exc)) from exc
    return JobSubmissionClient(url, headers=ray_http.auth_headers(ray_auth_token(cluster)))


def queue_start(job_id: int) -> None:
    """Submit the job's current attempt from a worker, once the surrounding transaction commits."""
    enqueue_on_commit("jobs.tasks.start_job_task", job_id)
