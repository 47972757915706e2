"""Issue 22: a recovery's per-job losses as rows (RecoveryJob) instead of a JSON list on the record, so a
job's GPU-hours lost is one indexed sum and lists annotate it in their own query."""

import django.db.models.deletion
from django.db import migrations, models
from django.utils.dateparse import parse_datetime


def copy_rows(apps, schema_editor):
    Recovery = apps.get_model("clusters", "Recovery")
    RecoveryJob = apps.get_model("clusters", "RecoveryJob")
    for recovery in Recovery.objects.exclude(jobs=[]).iterator():
        seen = set()
        for row in recovery.jobs or []:
            key = (row.get("job"), row.get("attempt"))
            resubmitted = parse_datetime(row.get("resubmitted_at") or "") or recovery.job_resubmitted_at
            if None in key or key in seen or resubmitted is None:
                continue
            seen.add(key)
            resumed = parse_datetime(row.get("training_resumed_at") or "")
            RecoveryJob.objects.create(
                recovery=recovery, job_id=row["job"], name=(row.get("name") or "")[:100],
                attempt=row["attempt"], last_step=row.get("last_step"),
                checkpoint_step=row.get("checkpoint_step"), checkpoint_path=(row.get("checkpoint_path") or "")[:500],
                steps_lost=row.get("steps_lost") or 0,
                steps_lost_is_lower_bound=bool(row.get("steps_lost_is_lower_bound")), step_s=row.get("step_s"),
                gpus=row.get("gpus") or 0, resubmitted_at=resubmitted, training_resumed_at=resumed,
                gpu_hours_lost=row.get("gpu_hours_lost"),
            )  # fmt: skip


class Migration(migrations.Migration):

    dependencies = [
        ('clusters', '0011_bandwidth_sample_source_provider'),
    ]

    operations = [
        migrations.CreateModel(
            name='RecoveryJob',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('job_id', models.PositiveBigIntegerField(db_index=True)),
                ('name', models.CharField(blank=True, max_length=100)),
                ('attempt', models.PositiveIntegerField(help_text='The attempt the recovery resubmitted.')),
                ('last_step', models.IntegerField(blank=True, help_text='The last step the job reached.', null=True)),
                ('checkpoint_step', models.IntegerField(blank=True, null=True)),
                ('checkpoint_path', models.CharField(blank=True, max_length=500)),
                ('steps_lost', models.IntegerField(default=0)),
                ('steps_lost_is_lower_bound', models.BooleanField(default=False)),
                ('step_s', models.FloatField(blank=True, help_text="The job's mean step time.", null=True)),
                ('gpus', models.PositiveIntegerField(default=0)),
                ('resubmitted_at', models.DateTimeField()),
                ('training_resumed_at', models.DateTimeField(blank=True, null=True)),
                ('gpu_hours_lost', models.FloatField(blank=True, null=True)),
                ('recovery', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='job_rows', to='clusters.recovery')),
            ],
            options={
                'ordering': ['id'],
                'constraints': [models.UniqueConstraint(fields=('recovery', 'job_id', 'attempt'), name='recovery_job_attempt_once')],
            },
        ),
        migrations.RunPython(copy_rows, migrations.RunPython.noop),
        migrations.RemoveField(
            model_name='recovery',
            name='jobs',
        ),
    ]
