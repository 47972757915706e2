"""Jobs on clusters: submit, follow, stop, list; the one face other apps and the entry points use.

A facade over the modules that do it, one per section of the work (CONVENTIONS.md "Split a module
along its own section banners behind a facade"): submission.py, following.py, checkpoints.py,
stopping.py, on top of onray.py (what a job gets on its cluster) and transitions.py (its lifecycle and
timeline). The modules of the app import each other; its entry points (tasks, api, views) and other apps
import this one.

```
submit_job() ─ Job(PENDING) + working dir prepared on Volt's side ─▶ start_job_task (queue jobs)
start_job():   Ray job submission API over HTTP with the cluster's token (never ray.init), submission id
               volt-<install>-job-<id>-a<attempt> (a redelivered task finds it submitted)
poll (beat):   status → JobStatus, new log text stored (logs outlive the cluster; read from the head host by
               byte offset, at most LOG_READ_MAX a read), VOLT_EVENT lines →
               first_step_at / last_step, busbw samples (source job), checkpoints rescanned
stop_job():    Ray stop → every host checked by the job's process marker, leftovers killed → STOPPED
```
Web processes only touch the database and Volt's own disk (the working dir); workers reach clusters.
"""

from __future__ import annotations

from jobs.checkpoints import (  # noqa: F401
    archive_name,
    check_may_download,
    checkpoint_archive,
    checkpoint_location,
    checkpoint_payload,
    download_url,
    latest_synchronized_checkpoint,
    rescan_checkpoints,
    scan_storage,
)
from jobs.following import (  # noqa: F401
    BROADCAST_LOG_MAX,
    LOG_PAGE_MAX,
    LOG_POLL_BUDGET_S,
    LOG_READ_MAX,
    LOG_READ_TIMEOUT_S,
    apply_events,
    follow_log,
    log_text_chunks,
    parse_events,
    poll_job,
    polled_job_ids,
    read_head_log,
    read_log,
    requeue_stuck_submissions,
    steps_reached,
    store_log,
)
from jobs.onray import (  # noqa: F401
    checkpoint_dir,
    job_marker,
    ray_client,
    runtime_env,
    submission_id,
)
from jobs.payloads import (  # noqa: F401
    job_payload,
)
from jobs.stopping import (  # noqa: F401
    cluster_status_changed,
    ensure_processes_gone,
    finish_stop,
    job_processes_by_host,
    stop_cluster_jobs,
    stop_job,
)
from jobs.submission import (  # noqa: F401
    DEMO_ENTRYPOINT,
    ENV_NAME,
    MAX_ENTRYPOINT,
    MAX_ENV_VARS,
    RESERVED_ENV,
    RESERVED_NAMES,
    SUBMITTABLE,
    ClusterNotReady,
    SubmitRefused,
    check_may_submit,
    demo_entrypoint,
    jobs_to_resume,
    resubmit_job,
    start_job,
    submit_job,
    validate_entrypoint,
    validate_env,
    visible_jobs,
)
from jobs.transitions import (  # noqa: F401
    note,
)
from jobs.workdirs import (  # noqa: F401
    CKPT_MODULE,
    WORKLOADS_DIR,
    JobInputError,
    prepare_working_dir,
    prune_working_dir,
    unpack_upload,
    workdirs_root,
)
