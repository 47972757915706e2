"""Issue 25: a host that was off when its cluster ended keeps the cluster's processes, user, key and workdir;
`cleaned_at` says which hosts were cleaned, so the reaper can try the others when they answer again. Nodes of
clusters that ended before this field count as cleaned (their teardown ran as it could then)."""

from django.db import migrations, models
from django.utils import timezone


def mark_ended(apps, schema_editor):
    ClusterNode = apps.get_model("clusters", "ClusterNode")
    ClusterNode.objects.filter(cluster__status__in=["terminated", "failed"]).update(
        cleaned_at=timezone.now()
    )


class Migration(migrations.Migration):
    dependencies = [("clusters", "0012_recovery_job_rows")]

    operations = [
        migrations.AddField(
            model_name="clusternode",
            name="cleaned_at",
            field=models.DateTimeField(
                blank=True,
                help_text="When the cluster's final teardown left nothing of it on this node's host (processes, "
                "Unix user, key, workdir); empty on an ended cluster while the host still holds them (it did not "
                "answer): the reaper tries again.",
                null=True,
            ),
        ),
        migrations.RunPython(mark_ended, migrations.RunPython.noop),
    ]
