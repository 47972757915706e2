"""Rows that left the queue before transitions dropped reservations on the way out: cleared once, since the
queue's planning no longer scans the table for them."""

from django.db import migrations


def clear(apps, schema_editor):
    Cluster = apps.get_model("clusters", "Cluster")
    leftovers = Cluster.objects.exclude(status="queued").exclude(reserved_from=None, start_bound_note="")
    leftovers.update(reserved_from=None, reserved_until=None, reserved_hosts=[], start_bound_note="")


class Migration(migrations.Migration):
    dependencies = [("clusters", "0015_cluster_reservation")]

    operations = [migrations.RunPython(clear, migrations.RunPython.noop)]
