"""`manage.py lab`: separate machines on this box (root only; inventory/lab/, docs/architecture.md "The lab").

lab up [--machines 8] [--providers 2] [--topology FILE] [--scale X] [--gate-port 22] [--lab 1]
lab down | lab status
lab power-off NAME | lab power-on NAME | lab unplug NAME | lab plug NAME
lab exec NAME [--user volt] -- COMMAND...
lab worker NAME [-- CELERY_ARGS...]     (a Volt Celery worker on a control machine, until Ctrl-C)
"""

from __future__ import annotations

import os
import subprocess

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from inventory import services
from inventory.lab import operations, topology
from inventory.lab.machines import SHARED_MOUNT


def _default_nics(model: str, count: int, kind: str) -> list:
    return services.default_local_spec(model, count, kind)["nics"]


class Command(BaseCommand):
    help = (
        "The lab: machines really apart on this box (network, mount and PID namespaces; sshd as PID 1; "
        "simulated GPUs), reached through loopback gates. Root only."
    )

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        up = actions.add_parser("up", help="Bring a lab up (removing a crashed one of the same number).")
        up.add_argument("--machines", type=int, default=8, help="Machines of the default topology (8).")
        up.add_argument(
            "--providers", type=int, default=2, help="Providers of the default topology (1 or 2)."
        )
        up.add_argument("--topology", default="", help="A topology JSON file instead of the default.")
        up.add_argument(
            "--scale",
            type=float,
            default=None,
            help="Link rates = declared GB/s x this (default VOLT_LOCAL_FABRIC_SCALE).",
        )
        up.add_argument("--gate-port", type=int, default=22, help="The gates' TCP port (22).")
        actions.add_parser("down", help="Remove the lab: namespaces, links, processes, its folder.")
        actions.add_parser("status", help="Machines, addresses, gates, power and cables.")
        for name, text in (
            ("power-off", "Cut a machine's power (SIGKILL its PID 1)."),
            ("power-on", "Boot a machine that is off."),
            ("unplug", "Take a machine's link down."),
            ("plug", "Bring a machine's link back up."),
        ):
            actions.add_parser(name, help=text).add_argument("machine")
        run = actions.add_parser("exec", help="Run a command inside a machine (its console).")
        run.add_argument("machine")
        run.add_argument("--user", default=None, help="As this user (a login shell); root by default.")
        run.add_argument("argv", nargs="+", help="The command (put it after --).")
        worker = actions.add_parser(
            "worker", help="Run a Volt Celery worker on a control machine, through the lab's network."
        )
        worker.add_argument("machine")
        worker.add_argument("celery_args", nargs="*", help="More `celery worker` options (after --).")
        for sub in actions.choices.values():
            sub.add_argument(
                "--lab", type=int, default=int(os.environ.get("VOLT_LAB", "1")), help="Lab number (1)."
            )

    def handle(self, action, lab, **options):
        base = settings.VOLT_LAB_DIR
        try:
            if action == "up":
                self._up(base, lab, options)
            elif action == "down":
                operations.down(base, lab, say=self._say)
            elif action == "status":
                self._status(base, lab)
            elif action in ("power-off", "power-on"):
                switch = operations.power_off if action == "power-off" else operations.power_on
                switch(base, lab, options["machine"], say=self._say)
            elif action in ("unplug", "plug"):
                operations.set_plugged(base, lab, options["machine"], action == "plug", say=self._say)
            elif action == "exec":
                self._exec(base, lab, options)
            elif action == "worker":
                self._worker(base, lab, options)
        except (operations.LabError, topology.TopologyError) as exc:
            raise CommandError(str(exc)) from None

    def _say(self, line: str) -> None:
        self.stdout.write(line)
        self.stdout.flush()

    def _up(self, base, lab, options) -> None:
        if options["topology"]:
            declared = topology.load_declared(options["topology"])
        else:
            declared = topology.default_topology(options["machines"], options["providers"])
        scale = options["scale"] if options["scale"] is not None else settings.VOLT_LOCAL_FABRIC_SCALE
        if not 0 < scale <= 1:
            raise CommandError(f"--scale must be above 0 and at most 1, not {scale}")
        services = operations.control_services(settings.DATABASES["default"], settings.REDIS_URL)
        operations.up(
            base, lab, declared, scale, options["gate_port"], default_nics=_default_nics, say=self._say,
            services=services, store_endpoint=settings.VOLT_STORE_ENDPOINT,
        )  # fmt: skip

    def _status(self, base, lab) -> None:
        try:
            status = operations.status(base, lab)
        except operations.LabError:
            others = operations.labs(base)
            suffix = f" (labs here: {', '.join(map(str, others))}; pick one with --lab)" if others else ""
            raise CommandError(f"lab {lab} is not up{suffix}") from None
        self._say(
            f"lab {status.lab}: {status.status}, {len(status.machines)} machines, links at the declared "
            f"rates x {status.scale:g}; shared storage at {SHARED_MOUNT} on every machine ({status.shared})"
        )
        self._say(
            f"log in: ssh -i {status.key_path} -p {status.machines[0].gate_port} {status.login_user}@GATE"
        )
        if status.store_endpoint:
            self._say(f"the checkpoint store, as every machine reaches it: {status.store_endpoint}")
        rows = [("MACHINE", "PROVIDER", "BLOCK", "GPUS", "ADDRESS", "GATE", "POWER", "CABLE", "BEHIND NAT")]
        for m in status.machines:
            cable = "plugged" if m.plugged else "unplugged"
            rows.append((m.name, m.provider, m.block, m.gpus, m.address, m.gate, m.power, cable, m.public))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            self._say("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())

    def _worker(self, base, lab, options) -> None:
        environment = operations.worker_environment(base, lab, dict(os.environ))
        extra = options["celery_args"][1:] if options["celery_args"][:1] == ["--"] else options["celery_args"]
        queues = ",".join(settings.VOLT_QUEUES)
        celery_args = ["-Q", queues, "-n", f"volt@{options['machine']}", "--prefetch-multiplier", "1", *extra]
        command = operations.worker_command(base, lab, options["machine"], celery_args)
        self._say(
            f"a Volt worker on {options['machine']} (queues {queues}); Ctrl-C or `lab power-off` ends it"
        )
        code = subprocess.run(command, env=environment).returncode  # secrets in its environment, not argv
        if code:
            raise SystemExit(code)

    def _exec(self, base, lab, options) -> None:
        argv = options["argv"][1:] if options["argv"][:1] == ["--"] else options["argv"]
        command = operations.command_in(base, lab, options["machine"], argv, user=options["user"])
        code = subprocess.run(command).returncode  # the terminal's own stdin and stdout: a console
        if code:
            raise SystemExit(code)
