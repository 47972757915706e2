"""Console pages for jobs: a team's jobs, the submit form of a cluster, a job's live page, its whole log as a
file, stop."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from clusters.models import Cluster
from jobs import recovery, services
from jobs.api.serializers import JobSubmitSerializer
from jobs.api.views import submit_from
from jobs.choices import LIVE, WAITING
from jobs.forms import JobForm
from voltweb.statemachine import IllegalTransition
from voltweb.streaming import ThreadedStreamingResponse


@login_required
def job_list(request):
    jobs = services.visible_jobs(request.user).select_related("cluster", "team", "created_by")
    cluster = request.GET.get("cluster")
    if cluster and cluster.isdigit():
        jobs = jobs.filter(cluster_id=int(cluster))
    page = Paginator(jobs, 25).get_page(request.GET.get("page"))
    return render(request, "jobs/list.html", {"page": page})


@login_required
def job_new(request, cluster_id):
    cluster = get_object_or_404(
        Cluster.objects.visible_to(request.user).select_related("team"), pk=cluster_id
    )
    try:
        services.check_may_submit(cluster, request.user)
    except services.SubmitRefused as exc:
        raise PermissionDenied(str(exc)) from None
    form = JobForm(request.POST or None, request.FILES or None)
    if request.method == "POST" and form.is_valid():
        serializer = JobSubmitSerializer(data=form.to_payload(cluster.pk), context={"request": request})
        if not form.errors and serializer.is_valid():
            try:
                job = submit_from(serializer, request.user)
                messages.success(request, f"Job {job.name} submitted; it starts in a few seconds.")
                return redirect("jobs:detail", cluster_id=cluster.pk, pk=job.pk)
            except (services.JobInputError, services.ClusterNotReady) as exc:
                form.add_error(None, str(exc))
        for field, errors in serializer.errors.items():
            form.add_error(field if field in form.fields else None, errors)
    status = 400 if request.method == "POST" else 200
    return render(request, "jobs/new.html", {"form": form, "cluster": cluster}, status=status)


def _job(request, cluster_id, pk):
    return get_object_or_404(
        services.visible_jobs(request.user).select_related("cluster", "team", "created_by"),
        pk=pk, cluster_id=cluster_id,
    )  # fmt: skip


@login_required
def job_detail(request, cluster_id, pk):
    job = _job(request, cluster_id, pk)
    context = {
        "job": job,
        "cluster": job.cluster,
        "checkpoints": [
            (c, services.checkpoint_location(c), services.download_url(c))
            for c in job.checkpoints.order_by("step")
        ],  # fmt: skip
        "events": job.events.all(),
        "can_stop": job.status in LIVE | WAITING,
        "log_tail": services.LOG_PAGE_MAX,
        "step_reached_before": recovery.step_reached_before(job),
    }
    return render(request, "jobs/detail.html", context)


@login_required
def job_log_download(request, cluster_id, pk):
    """The job's whole stored log as a text file, streamed chunk by chunk (up to VOLT_JOB_LOG_MAX_MB)."""
    job = _job(request, cluster_id, pk)
    response = ThreadedStreamingResponse(
        services.log_text_chunks(job), content_type="text/plain; charset=utf-8"
    )
    response["Content-Disposition"] = f'attachment; filename="job-{job.pk}.log"'
    return response


@login_required
@require_POST
def job_stop(request, cluster_id, pk):
    job = _job(request, cluster_id, pk)
    try:
        services.stop_job(job, actor=request.user)
        messages.success(request, f"Stopping job {job.name}: a worker stops it on every host.")
    except IllegalTransition as exc:
        messages.error(request, f"Job {job.name} already ended: it is {exc.current}.")
    return redirect("jobs:detail", cluster_id=cluster_id, pk=pk)
