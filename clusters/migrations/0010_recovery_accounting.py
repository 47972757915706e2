"""Issue 24.2: the recovery record names the resubmission and the training's own resumption apart, says
when "steps lost" is a lower bound, and stops counting the downtime twice in GPU-hours lost."""

from django.db import migrations, models


def recount(apps, schema_editor):
    """Old records added the cluster's GPUs x downtime to each job's figure, which already held it. A job
    row's figure (GPUs x (detection -> resubmission + lost steps' time)) is what the record means now; with
    several jobs the largest stands for it (their lost steps' time cannot be told apart in old rows)."""
    Recovery = apps.get_model("clusters", "Recovery")
    for recovery in Recovery.objects.exclude(jobs=[]):
        rows = [dict(row) for row in recovery.jobs]
        for row in rows:
            if "resumed_at" in row:
                row["resubmitted_at"] = row.pop("resumed_at")
        figures = [row.get("gpu_hours_lost") for row in rows if row.get("gpu_hours_lost") is not None]
        recovery.jobs = rows
        if figures:
            recovery.gpu_hours_lost = max(figures)
        recovery.save(update_fields=["jobs", "gpu_hours_lost"])


class Migration(migrations.Migration):
    dependencies = [
        ("clusters", "0009_cluster_node_user_removed_at"),
    ]

    operations = [
        migrations.RenameField(
            model_name="recovery", old_name="job_resumed_at", new_name="job_resubmitted_at"
        ),
        migrations.AlterField(
            model_name="recovery",
            name="job_resubmitted_at",
            field=models.DateTimeField(
                blank=True, help_text="The interrupted jobs were handed to Ray again.", null=True
            ),
        ),
        migrations.AddField(
            model_name="recovery",
            name="training_resumed_at",
            field=models.DateTimeField(
                blank=True,
                help_text="A resubmitted job logged a training step again (its own clock).",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="recovery",
            name="steps_lost_is_lower_bound",
            field=models.BooleanField(
                default=False, help_text="The job may have stepped past the last step it logged."
            ),
        ),
        migrations.AlterField(
            model_name="recovery",
            name="gpu_hours_lost",
            field=models.FloatField(
                blank=True,
                help_text="GPUs of the cluster x (detection -> training stepped again + the lost steps' time).",
                null=True,
            ),
        ),
        migrations.RunPython(recount, migrations.RunPython.noop),
    ]
