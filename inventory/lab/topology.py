"""The lab's declared topology (pure): sites, fabrics and machines, their addresses and link rates.

A topology is a JSON object (or the default built by `default_topology`):

    {"sites":   {"iad1": {"region": "us-east", "backbone_gbytes_per_s": 12.5}},
     "fabrics": {"iad1-ndr": {"site": "iad1", "kind": "ib_ndr", "per_host_gbytes_per_s": 400,
                              "oversubscription": 2}},
     "machines": [{"name": "nw-01", "provider": "northwind", "fabric": "iad1-ndr", "block": "r1",
                   "gpu_model": "H100", "gpu_count": 8}]}

A machine may also give `nics` (the simulator's spec: inventory/drivers/simulator.py); without, the lab
gives it its fabric kind's default ports, as local hosts get. `"role": "control"` makes it a machine for
Volt's own processes rather than a provider's host (`lab worker`): it sees Volt's install at its path
(read-only), reaches the control plane's PostgreSQL and Redis at CONTROL_ADDRESS, and every machine's sshd
at its gate address, as the root namespace does. Machine names are host names: lower-case
letters, digits and dashes.

A provider may sit behind NAT, as real providers' machines do:

    "providers": {"helios": {"nat": true, "forward_udp": false}}

Its network's gateway then forwards only each machine's SSH port and (unless `forward_udp` is false: the
relay case) one UDP port, from the provider's public address; nothing outside the network reaches a
machine's private address, and what a machine sends out leaves from the public address. A provider not
named there is routed: every machine reaches its private addresses (`inventory/lab/network.py`).

Addresses (all inside the lab's own namespaces): provider p (in order of first appearance, from 1) has the
network 10.77.p.0/24 with its gateway, the router, at .1; its k-th machine is 10.77.p.(10+k). Gates, the
only lab addresses in the root namespace, are 127.77.<lab>.<n> for the n-th machine: outside 127.0.0.0/16,
where local hosts take their 127.0.x.y. Link rates are the emulated fabric's (inventory/fabric_emulation.py):
the declared figure of the finest level two machines share, times the scale. A NAT'd provider's public
address is 10.77.255.p (on the router, outside every provider's network); its k-th machine's SSH is
forwarded from port 22000+k there, its UDP port (OVERLAY_PORT on the machine) from 51820+k.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from inventory.fabric_emulation import LEVELS, LinkEnd, common_level, pair_rate_bytes

LAB_NETWORK = ipaddress.ip_network("10.77.0.0/16")
# The control plane's services (PostgreSQL, Redis) as control machines reach them: an address of the router
# namespace alone (on its lo), outside every provider's network.
CONTROL_ADDRESS = "10.77.0.1"
ROLES = ("gpu", "control")
GATE_NETWORK = ipaddress.ip_network("127.77.0.0/16")
PUBLIC_NETWORK = ipaddress.ip_network("10.77.255.0/24")  # NAT'd providers' public addresses, on the router
PUBLIC_SSH_PORT_BASE = 22000
PUBLIC_UDP_PORT_BASE = 51820
OVERLAY_PORT = 51820  # the UDP port a machine's overlay listens on, where a NAT'd provider forwards one
PROVIDER_OPTIONS = ("nat", "forward_udp")
FIRST_MACHINE_OCTET = 10
MAX_PROVIDERS = 250
MAX_MACHINES_PER_PROVIDER = 240
MAX_MACHINES = 250  # one gate address per machine: 127.77.<lab>.1-250
SSH_PORT = 22
FABRIC_KINDS = ("ib_ndr", "ib_hdr", "roce", "eth_100g", "eth_25g", "eth_10g")
_NAME = re.compile(r"^[a-z][a-z0-9-]{0,30}$")

# The default lab: two providers in one region, each one site and one fabric, blocks (racks) of two.
_DEFAULT_PROVIDERS = (
    {
        "provider": "northwind",
        "prefix": "nw",
        "site": "iad1",
        "region": "us-east",
        "fabric": "iad1-ndr",
        "kind": "ib_ndr",
        "per_host_gbytes_per_s": 400.0,
        "oversubscription": 2.0,
        "gpus": (("H100", 8), ("H100", 8), ("A100", 8), ("A100", 8)),
    },
    {
        "provider": "helios",
        "prefix": "he",
        "site": "ord1",
        "region": "us-east",
        "fabric": "ord1-roce",
        "kind": "roce",
        "per_host_gbytes_per_s": 200.0,
        "oversubscription": 2.0,
        "gpus": (("L40S", 4), ("L40S", 4), ("RTX 4090", 8), ("RTX 4090", 8)),
    },
)
MACHINES_PER_BLOCK = 2
BLOCKS_PER_TURN = 2  # a provider gets two blocks, then the next provider's turn


class TopologyError(ValueError):
    """The declared topology is not one the lab can build; the message says what to change."""


@dataclass(frozen=True)
class Machine:
    """One lab machine: where it sits, its GPU spec, its lab address and its gate."""

    name: str
    provider: str
    region: str
    site: str
    fabric: str
    block: str
    spec: dict  # the simulator's spec.json (gpu_model, gpu_count, nics, seed)
    address: str  # on its provider's network, inside the lab
    gate: str  # 127.77.<lab>.<n> in the root namespace
    ordinal: int  # n, from 1
    provider_ordinal: int  # p, from 1
    fabric_gbps: float
    oversubscription: float
    backbone_gbps: float
    role: str = "gpu"  # or "control": runs Volt's own processes (see the module's docstring)
    public_address: str = ""  # its NAT'd provider's public address ("" when routed)
    public_ssh_port: int = 0  # where that address forwards to its sshd
    public_udp_port: int = 0  # where it forwards to its OVERLAY_PORT (0: none)

    @property
    def ssh_endpoint(self) -> tuple[str, int]:
        """Where a machine outside its network opens its SSH: the forwarded port, or its own address."""
        if self.public_address:
            return self.public_address, self.public_ssh_port
        return self.address, SSH_PORT

    @property
    def ssh_target(self) -> str:
        return "{}:{}".format(*self.ssh_endpoint)

    @property
    def udp_endpoint(self) -> str:
        """ "ADDRESS:PORT" where a machine outside its network reaches its OVERLAY_PORT ("" when none is)."""
        if not self.public_address:
            return f"{self.address}:{OVERLAY_PORT}"
        return f"{self.public_address}:{self.public_udp_port}" if self.public_udp_port else ""

    @property
    def link_end(self) -> LinkEnd:
        return LinkEnd(
            address=self.address,
            path=(self.region, self.site, self.fabric, self.block),
            fabric_gbps=self.fabric_gbps,
            oversubscription=self.oversubscription,
            backbone_gbps=self.backbone_gbps,
        )


@dataclass(frozen=True)
class Provider:
    """A provider's network: one bridge in the router namespace, the gateway at .1."""

    name: str
    ordinal: int
    network: str  # "10.77.p.0/24"
    gateway: str  # "10.77.p.1"
    nat: bool = False  # behind NAT: only SSH and (forward_udp) one UDP port per machine are forwarded
    forward_udp: bool = False
    public_address: str = ""  # 10.77.255.p when NAT'd


@dataclass(frozen=True)
class Topology:
    """A lab's machines and providers, with every address decided."""

    lab: int
    machines: tuple[Machine, ...]
    providers: tuple[Provider, ...]
    declared: dict = field(default_factory=dict)  # the JSON it was built from

    def machine(self, name: str) -> Machine:
        for machine in self.machines:
            if machine.name == name:
                return machine
        raise TopologyError(f"no machine {name!r} in lab {self.lab}: {', '.join(self.names)}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.machines)

    def provider(self, name: str) -> Provider:
        return next(p for p in self.providers if p.name == name)

    def level(self, a: Machine, b: Machine) -> str:
        """The finest level of the topology that holds both machines (block, fabric, site, region, global)."""
        return common_level(a.link_end, b.link_end)

    def rate_bytes(self, src: Machine, dst: Machine, scale: float) -> int:
        """Bytes/s from src to dst: the finest shared level's declared figure times `scale`."""
        return pair_rate_bytes(src.link_end, dst.link_end, scale)


def default_topology(machines: int = 8, providers: int = 2) -> dict:
    """The declared topology of a default lab of `machines` machines across `providers` providers (1 or 2).

    Machines fill blocks of two; each provider takes two blocks in turn (8 machines: northwind r1, r2,
    helios r1, r2), so a small lab still has two machines in one block and two in different blocks.
    """
    if not 1 <= providers <= len(_DEFAULT_PROVIDERS):
        raise TopologyError(f"the default lab has 1 or {len(_DEFAULT_PROVIDERS)} providers, not {providers}")
    if not 1 <= machines <= MAX_MACHINES:
        raise TopologyError(f"a lab has 1 to {MAX_MACHINES} machines, not {machines}")
    chosen = _DEFAULT_PROVIDERS[:providers]
    declared: dict = {"sites": {}, "fabrics": {}, "machines": []}
    for p in chosen:
        declared["sites"][p["site"]] = {"region": p["region"], "backbone_gbytes_per_s": 12.5}
        declared["fabrics"][p["fabric"]] = {
            "site": p["site"],
            "kind": p["kind"],
            "per_host_gbytes_per_s": p["per_host_gbytes_per_s"],
            "oversubscription": p["oversubscription"],
        }
    counts = [0] * len(chosen)
    per_turn = MACHINES_PER_BLOCK * BLOCKS_PER_TURN
    for i in range(machines):
        turn, slot = divmod(i, per_turn)
        which = turn % len(chosen)
        p, k = chosen[which], counts[which]
        counts[which] += 1
        model, count = p["gpus"][k % len(p["gpus"])]
        declared["machines"].append(
            {
                "name": f"{p['prefix']}-{k + 1:02d}",
                "provider": p["provider"],
                "fabric": p["fabric"],
                "block": f"r{k // MACHINES_PER_BLOCK + 1}",
                "gpu_model": model,
                "gpu_count": count,
            }
        )
    return declared


def load_declared(path: Path) -> dict:
    try:
        declared = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise TopologyError(f"cannot read the topology {path}: {exc}") from None
    if not isinstance(declared, dict):
        raise TopologyError(f"{path}: a topology is a JSON object with sites, fabrics and machines")
    return declared


def build(lab: int, declared: dict, default_nics: Callable[[str, int, str], list] | None = None) -> Topology:
    """Check `declared` and give every machine its addresses; `default_nics(model, count, fabric_kind)`
    gives the NICs of a machine that declares none."""
    if not 1 <= lab <= 254:
        raise TopologyError(f"lab numbers run from 1 to 254, not {lab}")
    sites, fabrics = _dict(declared, "sites"), _dict(declared, "fabrics")
    options = _provider_options(declared)
    entries = declared.get("machines")
    if not isinstance(entries, list) or not entries:
        raise TopologyError("the topology declares no machines")
    if len(entries) > MAX_MACHINES:
        raise TopologyError(f"a lab has at most {MAX_MACHINES} machines, not {len(entries)}")
    providers: dict[str, Provider] = {}
    per_provider: dict[str, int] = {}
    machines: list[Machine] = []
    for ordinal, entry in enumerate(entries, start=1):
        name = _name(entry, "name")
        provider = _name(entry, "provider")
        if provider not in providers:
            if len(providers) == MAX_PROVIDERS:
                raise TopologyError(f"a lab has at most {MAX_PROVIDERS} providers")
            p = len(providers) + 1
            net = ipaddress.ip_network(f"{LAB_NETWORK.network_address + (p << 8)}/24")
            nat = options.get(provider, {}).get("nat", False)
            providers[provider] = Provider(
                provider, p, str(net), str(net.network_address + 1),
                nat=nat,
                forward_udp=nat and options[provider].get("forward_udp", True),
                public_address=str(PUBLIC_NETWORK.network_address + p) if nat else "",
            )  # fmt: skip
        per_provider[provider] = k = per_provider.get(provider, 0) + 1
        if k > MAX_MACHINES_PER_PROVIDER:
            raise TopologyError(f"provider {provider} has more than {MAX_MACHINES_PER_PROVIDER} machines")
        fabric_name = entry.get("fabric")
        fabric = fabrics.get(fabric_name)
        if not isinstance(fabric, dict):
            raise TopologyError(f"machine {name}: fabric {fabric_name!r} is not declared under fabrics")
        site = sites.get(fabric.get("site"))
        if not isinstance(site, dict):
            raise TopologyError(
                f"fabric {fabric_name}: site {fabric.get('site')!r} is not declared under sites"
            )
        kind = fabric.get("kind", "ib_ndr")
        if kind not in FABRIC_KINDS:
            raise TopologyError(
                f"fabric {fabric_name}: kind {kind!r} is not one of {', '.join(FABRIC_KINDS)}"
            )
        network = ipaddress.ip_network(providers[provider].network)
        role = entry.get("role", "gpu")
        if role not in ROLES:
            raise TopologyError(f"machine {name}: role {role!r} is not one of {', '.join(ROLES)}")
        machines.append(
            Machine(
                name=name,
                provider=provider,
                region=str(site.get("region", "lab")),
                site=str(fabric["site"]),
                fabric=str(fabric_name),
                block=f"{fabric_name}/{_name(entry, 'block')}",
                spec=_gpu_spec(name, entry, kind, default_nics),
                address=str(network.network_address + FIRST_MACHINE_OCTET + k),
                gate=str(GATE_NETWORK.network_address + (lab << 8) + ordinal),
                ordinal=ordinal,
                provider_ordinal=providers[provider].ordinal,
                fabric_gbps=_positive(fabric, "per_host_gbytes_per_s", fabric_name),
                oversubscription=_positive(fabric, "oversubscription", fabric_name, 1.0),
                backbone_gbps=_positive(site, "backbone_gbytes_per_s", str(fabric["site"]), 12.5),
                role=role,
                public_address=providers[provider].public_address,
                public_ssh_port=PUBLIC_SSH_PORT_BASE + k if providers[provider].nat else 0,
                public_udp_port=PUBLIC_UDP_PORT_BASE + k if providers[provider].forward_udp else 0,
            )
        )
    unknown = sorted(set(options) - set(providers))
    if unknown:
        raise TopologyError(f"providers {', '.join(unknown)} are configured but no machine is theirs")
    names = [m.name for m in machines]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise TopologyError(f"machine names must be unique: {', '.join(duplicates)}")
    return Topology(lab, tuple(machines), tuple(providers.values()), declared)


def _dict(declared: dict, key: str) -> dict:
    value = declared.get(key, {})
    if not isinstance(value, dict):
        raise TopologyError(f"the topology's {key} is an object keyed by name")
    return value


def _provider_options(declared: dict) -> dict[str, dict]:
    """The topology's "providers" object: per provider, whether it is NAT'd and forwards a UDP port."""
    options = _dict(declared, "providers")
    for name, entry in options.items():
        if not isinstance(entry, dict) or set(entry) - set(PROVIDER_OPTIONS):
            raise TopologyError(
                f"provider {name}: its options are an object with {' and '.join(PROVIDER_OPTIONS)}, not {entry!r}"
            )
        for key, value in entry.items():
            if not isinstance(value, bool):
                raise TopologyError(f"provider {name}: {key} is true or false, not {value!r}")
        if entry.get("forward_udp") is not None and not entry.get("nat", False):
            raise TopologyError(f"provider {name}: forward_udp applies to a NAT'd provider (set nat: true)")
    return options


def _name(entry: object, key: str) -> str:
    value = entry.get(key) if isinstance(entry, dict) else None
    if not isinstance(value, str) or not _NAME.match(value):
        raise TopologyError(
            f"{entry!r}: {key} should be lower-case letters, digits and dashes, starting with a letter"
        )
    return value


def _positive(entry: dict, key: str, owner: str, default: float | None = None) -> float:
    value = entry.get(key, default)
    if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
        raise TopologyError(f"{owner}: {key} should be a positive number of GB/s (or a ratio), not {value!r}")
    return float(value)


def _gpu_spec(name: str, entry: dict, kind: str, default_nics) -> dict:
    model, count = entry.get("gpu_model"), entry.get("gpu_count")
    if not isinstance(model, str) or not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise TopologyError(f'machine {name}: declare gpu_model (e.g. "H100") and gpu_count (1 or more)')
    spec = {"gpu_model": model, "gpu_count": count, "seed": f"lab-{name}"}
    for key in ("nvlink", "driver_version", "cuda_version"):
        if key in entry:
            spec[key] = entry[key]
    if "nics" in entry:
        spec["nics"] = entry["nics"]
    elif default_nics is not None:
        spec["nics"] = default_nics(model, count, kind)
    return spec


def as_json(topology: Topology) -> dict:
    """What the state file keeps of a topology (enough to rebuild it with `from_json`)."""
    return {"lab": topology.lab, "machines": [asdict(m) for m in topology.machines],
            "providers": [asdict(p) for p in topology.providers], "declared": topology.declared}  # fmt: skip


def from_json(data: dict) -> Topology:
    return Topology(
        lab=int(data["lab"]),
        machines=tuple(Machine(**m) for m in data["machines"]),
        providers=tuple(Provider(**p) for p in data["providers"]),
        declared=data.get("declared", {}),
    )


__all__ = ["LEVELS", "Machine", "Provider", "Topology", "TopologyError", "build", "default_topology"]
