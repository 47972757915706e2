"""Build or check the local hosts' Ray runtime (inventory/local_runtime.py, DESIGN.md "Host runtime")."""

from __future__ import annotations

import os
import time

from django.core.management.base import BaseCommand, CommandError

from inventory import local_runtime


class Command(BaseCommand):
    help = (
        "Build (if missing) the venv local hosts run Ray from: Volt's exact ray[default], torch and numpy on "
        "a system Python every user can run, so a cluster's own Unix user can run it. --check only reports; "
        "--rebuild replaces one that does not match."
    )

    def add_arguments(self, parser):
        parser.add_argument("--check", action="store_true", help="Report only; exit 1 if it is not ready.")
        parser.add_argument("--rebuild", action="store_true", help="Replace a runtime that does not match.")
        parser.add_argument(
            "--path", default="", help="Where (default: VOLT_LOCAL_RUNTIME or /opt/volt/...)."
        )

    def handle(self, check, rebuild, path, **options):
        where = path or None
        if check:
            status = local_runtime.check(where)
            if status.ready:
                self.stdout.write(f"{status.path}: ready ({local_runtime.describe(status)})")
                return
            if not status.exists:
                raise CommandError(f"{status.path} does not exist: run `python manage.py local_runtime`.")
            raise CommandError(local_runtime.mismatch_message(status))
        if os.geteuid() != 0 and not where:
            self.stdout.write("Not root: local hosts run Ray as this user from Volt's own environment.")
        started = time.monotonic()
        built = []  # the "(built)" line, said with how long the build took (a ready runtime: no timing)

        def log(line: str) -> None:
            if line.endswith("(built)"):
                built.append(line)
            else:
                self.stdout.write(line)

        try:
            local_runtime.build(where, rebuild=rebuild, log=log)
        except local_runtime.RuntimeMismatch as exc:
            raise CommandError(str(exc)) from exc
        if built:
            self.stdout.write(
                f"{built[0].removesuffix('(built)')}(built in {time.monotonic() - started:.0f} s)"
            )
