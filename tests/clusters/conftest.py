"""Inventory built straight in the database (no discovery run) so placement tests stay fast."""

import pytest


@pytest.fixture
def rack(northwind_ib, make_host):
    """Northwind's iad1 InfiniBand fabric: 3 H100 hosts in r01, 2 in r02."""
    r01, r02 = northwind_ib.blocks.order_by("name")
    return {
        "r01": [make_host(r01, price="2.50") for _ in range(3)],
        "r02": [make_host(r02, price="2.40") for _ in range(2)],
    }


def spec(**overrides) -> dict:
    base = {"name": "run", "nodes": 2, "gpus_per_node": 8, "gpu_models": ["H100"]}
    return base | overrides


class ProbeHostsDriver:
    """The host driver seam for the all-reduce probe: rank 0's command answers `output` (its result
    line) and the other ranks answer nothing; `commands` records every command run, in order."""

    def __init__(self, address: str, script: "ProbeScript"):
        self.address = address
        self.script = script

    def run(self, command: str, timeout: float | None = None):
        from inventory.drivers.base import CommandResult

        self.script.commands.append(command)
        if " --rank 0 " in command:
            return CommandResult(self.script.returncode, self.script.output, self.script.stderr)
        return CommandResult(0, "", "")

    def close(self) -> None:
        pass


class ProbeScript:
    def __init__(self):
        self.output, self.stderr, self.returncode = "", "", 0
        self.commands: list[str] = []

    def answer(self, output: str, returncode: int = 0, stderr: str = "") -> None:
        """What rank 0 prints from now on. Nodes without a Ray port slot get one, as bring-up gives."""
        from clusters.models import ClusterNode

        self.output, self.returncode, self.stderr = output, returncode, stderr
        free = ClusterNode.objects.filter(slot__isnull=True, released_at__isnull=True)
        for number, node_id in enumerate(free.values_list("pk", flat=True)):
            ClusterNode.objects.filter(pk=node_id).update(slot=80 + number)

    def argument(self, name: str) -> str:
        """The value of `name` (e.g. "--budget-s") on the last rank 0 command line."""
        command = [c for c in self.commands if " --rank 0 " in c][-1]
        words = command.split("<<")[0].split()
        return words[words.index(name) + 1]


@pytest.fixture
def probe_hosts(monkeypatch):
    """Every host answers through a ProbeHostsDriver; give rank 0's output with `.answer(...)`."""
    from inventory import services as inventory

    script = ProbeScript()
    monkeypatch.setattr(inventory, "driver_for", lambda host: ProbeHostsDriver(host.address, script))
    return script
