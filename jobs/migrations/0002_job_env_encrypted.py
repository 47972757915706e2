"""A job's environment is encrypted at rest (issue 21): `env` (JSON) becomes `env_encrypted` (Fernet)."""

import json

from django.db import migrations, models


def encrypt_env(apps, schema_editor):
    from voltweb import crypto

    Job = apps.get_model("jobs", "Job")
    for job in Job.objects.exclude(env={}).only("pk", "env").iterator():
        Job.objects.filter(pk=job.pk).update(
            env_encrypted=crypto.encrypt(json.dumps(job.env, sort_keys=True))
        )


def decrypt_env(apps, schema_editor):
    from voltweb import crypto

    Job = apps.get_model("jobs", "Job")
    for job in Job.objects.exclude(env_encrypted="").only("pk", "env_encrypted").iterator():
        Job.objects.filter(pk=job.pk).update(env=json.loads(crypto.decrypt(job.env_encrypted)))


class Migration(migrations.Migration):
    dependencies = [("jobs", "0001_initial")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="env_encrypted",
            field=models.TextField(
                blank=True,
                help_text="The caller's environment variables: JSON, Fernet-encrypted at rest (`env`).",
            ),
        ),
        migrations.RunPython(encrypt_env, decrypt_env),
        migrations.RemoveField(model_name="job", name="env"),
    ]
