"""Inventory API latency at scale: 100,000 hosts / ~800,000 GPUs in PostgreSQL.

Seeds a dedicated database (dropped and recreated at start, dropped at the end unless --keep) with a
realistic topology — regions, sites, fabrics of mixed kinds, racks of 16-32 hosts, ~40 providers, mixed GPU
models and partial occupancy — then times the offers, host-list and GPU-list endpoints in process through
Django's test Client (full middleware, bearer-token auth, real PostgreSQL). No host is ever contacted: the
`ssh` hosts carry fake 10.x addresses.

    .venv/bin/python bench/inventory.py [--hosts 100000] [--requests 200] [--keep | --reuse] [--explain]
        [--database-url postgres://postgres@127.0.0.1:5432/volt_bench]

--keep leaves the seeded database in place; --reuse times it again without seeding and keeps it (after a code
or index change: migrations still run). --explain prints EXPLAIN ANALYZE of every query of each scenario.

Prints a table, then one JSON line (the last line of stdout) with every figure.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, Python puts bench/ first on sys.path, where this file would shadow the `inventory` app.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench._common import emit_json, latency_summary, print_table  # noqa: E402

TARGET_P95_MS = 150
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/volt_bench"

REGIONS = {
    "us-east": ["iad", "bos", "atl", "nyc", "clt"],
    "us-west": ["sjc", "sea", "pdx", "lax", "phx"],
    "us-central": ["dfw", "ord", "den", "msp", "mci"],
    "eu-west": ["ams", "lhr", "fra", "cdg", "dub"],
    "eu-north": ["arn", "hel", "osl", "cph", "kef"],
    "ap-northeast": ["nrt", "icn", "kix", "tpe", "hkg"],
}
REGION_PRICE_FACTOR = {
    "us-east": 1.0,
    "us-west": 1.05,
    "us-central": 0.95,
    "eu-west": 1.1,
    "eu-north": 0.9,
    "ap-northeast": 1.15,
}
FABRIC_KIND_WEIGHTS = {"ib_ndr": 25, "ib_hdr": 15, "roce": 20, "eth_100g": 25, "eth_25g": 15}
# Which GPUs a rack on each kind of fabric holds (racks are homogeneous).
MODELS_BY_FABRIC = {
    "ib_ndr": {"H100": 60, "H200": 40},
    "ib_hdr": {"A100": 70, "H100": 30},
    "roce": {"H100": 50, "A100": 40, "H200": 10},
    "eth_100g": {"L40S": 50, "A100": 30, "RTX 4090": 20},
    "eth_25g": {"RTX 4090": 60, "L40S": 40},
}
FOUR_GPU_MODELS = {"L40S", "RTX 4090"}  # some of their racks hold 4-GPU servers
BASE_PRICE = {"H200": 3.79, "H100": 2.49, "A100": 1.29, "L40S": 0.89, "RTX 4090": 0.39}
HOST_STATE_WEIGHTS = {
    "available": 86,
    "draining": 4,
    "cordoned": 3,
    "offline": 3,
    "retired": 2,
    "failed": 1,
    "onboarding": 1,
}
PCI_BUSES = [0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB]
PROVIDER_WORDS = [
    "Atlas",
    "Boreal",
    "Cobalt",
    "Delphi",
    "Ember",
    "Fjord",
    "Granite",
    "Helix",
    "Indigo",
    "Juniper",
    "Kestrel",
    "Lumen",
    "Meridian",
    "Nimbus",
    "Obsidian",
    "Polar",
    "Quartz",
    "Rook",
    "Sable",
    "Tundra",
]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=100_000, help="hosts to seed (default: 100000)")
    parser.add_argument("--requests", type=int, default=200, help="timed requests per scenario")
    parser.add_argument("--warmup", type=int, default=5, help="untimed requests per scenario first")
    parser.add_argument(
        "--database-url",
        default=DEFAULT_DATABASE_URL,
        help=f"a PostgreSQL database the bench may drop and fill (default: {DEFAULT_DATABASE_URL})",
    )
    parser.add_argument("--seed", type=int, default=7, help="random seed of the seeded inventory")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="time the inventory already in the database (from --keep): no seeding",
    )
    parser.add_argument(
        "--explain", action="store_true", help="print EXPLAIN ANALYZE of each scenario's queries"
    )
    return parser.parse_args()


# --- database --------------------------------------------------------------------------------------


def recreate_database(url: str, drop_only: bool = False) -> None:
    """Drop (and unless drop_only, create) the database named in `url`, connected to `postgres`."""
    import psycopg
    from psycopg import sql

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    if not name or name in {"postgres", "template0", "template1", "test"}:
        raise SystemExit(f"refusing to drop database {name!r}; give the benchmark its own database")
    admin_url = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        if not drop_only:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def setup_django(url: str) -> None:
    """Volt's production settings (DEBUG=0) on the bench's database, as a server behind TLS would run them.

    DEBUG=0 refuses the source's dev SECRET_KEY and wants ALLOWED_HOSTS, and redirects plain HTTP to
    https (the test Client speaks plain HTTP: every call answered 301): the bench brings a throwaway key,
    its host names, and no redirect. Values set in the environment win.
    """
    os.environ["DJANGO_SETTINGS_MODULE"] = "voltweb.settings"
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DEBUG", "0")
    os.environ.setdefault("SECRET_KEY", "inventory-bench-" + os.urandom(24).hex())
    os.environ.setdefault("ALLOWED_HOSTS", "testserver,localhost,127.0.0.1")
    os.environ.setdefault("SECURE_SSL_REDIRECT", "0")
    # WhiteNoise warns of a missing STATIC_ROOT on a fresh clone (nothing collected): the bench serves no
    # static file, so an empty folder of its own stands in.
    os.environ.setdefault("STATIC_ROOT", tempfile.mkdtemp(prefix="volt-bench-static-"))
    import django
    from django.test.utils import setup_test_environment

    django.setup()
    setup_test_environment(debug=False)  # DEBUG off as in production; allows the test Client's host


# --- seeding -----------------------------------------------------------------------------------------


def weighted(rng: random.Random, weights: dict[str, int]) -> str:
    return rng.choices(list(weights), weights=list(weights.values()))[0]


@dataclass
class SeedResult:
    hosts: int
    gpus: int
    providers: int
    sites: int
    fabrics: int
    blocks: int
    seconds: float
    largest_approved_provider_id: int
    median_approved_provider_id: int


@dataclass
class Topology:
    providers: list
    sites: list
    fabrics: list
    racks: list  # (Block, number of hosts)
    provider_factor: dict[int, float]


# Columns this bench fills itself; any other column a newer model has gets its field default.
HOST_COLUMNS = (
    "id provider_id name site_id fabric_id block_id driver address ssh_port ssh_user ssh_private_key_encrypted "
    "ssh_host_key local_spec state price_per_gpu_hour reliability last_heartbeat_at gpu_model gpu_count free_gpus "
    "nvlink_domain_size error_code error_message discovery onboarding_started_at created_at updated_at"
).split()
GPU_COLUMNS = (
    "host_id index uuid model name memory_mib nvlink_domain pci_bus_id health temperature_c utilization_pct "
    "ecc_uncorrectable"
).split()
COPY_CHUNK_CHARS = 4_000_000


def seed(n_hosts: int, rng: random.Random) -> SeedResult:
    """Topology through the ORM's bulk_create, hosts and GPUs through COPY; then VACUUM ANALYZE."""
    from django.db import connection

    from inventory.choices import ProviderStatus

    started = time.perf_counter()
    with connection.cursor() as cur:
        cur.execute("SET synchronous_commit = off")
        topo = _seed_topology(n_hosts, rng)
        gpu_plan = _copy_hosts(cur, topo, rng)
        n_gpus = _copy_gpus(cur, gpu_plan, rng)
        cur.execute("SELECT setval(pg_get_serial_sequence('inventory_host', 'id'), %s)", [len(gpu_plan)])
        cur.execute("VACUUM (ANALYZE)")  # statistics, and the visibility map index-only scans need
    hosts_by_provider: dict[int, int] = {}
    for block, size in topo.racks:
        hosts_by_provider[block.fabric.provider_id] = (
            hosts_by_provider.get(block.fabric.provider_id, 0) + size
        )
    approved = [p.pk for p in topo.providers if p.status == ProviderStatus.APPROVED]
    by_size = sorted(approved, key=lambda pk: hosts_by_provider.get(pk, 0))
    return SeedResult(
        hosts=len(gpu_plan),
        gpus=n_gpus,
        providers=len(topo.providers),
        sites=len(topo.sites),
        fabrics=len(topo.fabrics),
        blocks=len(topo.racks),
        seconds=time.perf_counter() - started,
        largest_approved_provider_id=by_size[-1],
        median_approved_provider_id=by_size[len(by_size) // 2],
    )


def _seed_topology(n_hosts: int, rng: random.Random) -> Topology:
    """~40 providers (mostly approved), 30 sites in 6 regions, 120 fabrics, racks of 16-32 hosts."""
    from inventory.choices import DEFAULT_HOST_BANDWIDTH_GBYTES, ProviderStatus
    from inventory.models import Block, Fabric, Provider, Site

    now = datetime.now(UTC)
    names = [f"{a} {b}" for b in ["Compute", "Cloud", "GPU"] for a in PROVIDER_WORDS][:40]
    statuses = [ProviderStatus.APPROVED] * 34 + [ProviderStatus.PENDING] * 3 + [ProviderStatus.SUSPENDED] * 3
    rng.shuffle(statuses)
    providers = Provider.objects.bulk_create(
        Provider(
            name=n,
            slug=n.lower().replace(" ", "-"),
            status=s,
            contact_email=f"ops@{n.split()[0].lower()}.example",
            reviewed_at=now if s != ProviderStatus.PENDING else None,
        )
        for n, s in zip(names, statuses, strict=True)
    )
    sites = Site.objects.bulk_create(
        Site(name=f"{code}1", region=region, backbone_gbytes_per_s=rng.choice([12.5, 25.0]))
        for region, codes in REGIONS.items()
        for code in codes
    )
    # Every provider gets one fabric; the other 80 go to providers by a Zipf-like size.
    owners = list(providers) + rng.choices(providers, weights=[1 / (i + 1) ** 0.8 for i in range(40)], k=80)
    fabrics = []
    for i, provider in enumerate(owners):
        kind = weighted(rng, FABRIC_KIND_WEIGHTS)
        fabrics.append(
            Fabric(
                provider=provider,
                site=rng.choice(sites),
                name=f"{provider.slug}-{kind.replace('_', '-')}-{i:03d}",
                kind=kind,
                per_host_gbytes_per_s=DEFAULT_HOST_BANDWIDTH_GBYTES[kind],
                oversubscription=rng.choice([1.0, 1.0, 2.0, 3.0]),
            )
        )
    fabrics = Fabric.objects.bulk_create(fabrics)
    shares = [rng.uniform(0.4, 1.6) for _ in fabrics]
    per_fabric = [int(n_hosts * share / sum(shares)) for share in shares]
    per_fabric[0] += n_hosts - sum(per_fabric)
    racks = []
    for fabric, count in zip(fabrics, per_fabric, strict=True):
        for j, size in enumerate(_rack_sizes(rng, count)):
            racks.append((Block(fabric=fabric, name=f"rack-{j:03d}"), size))
    Block.objects.bulk_create(block for block, _ in racks)
    return Topology(providers, sites, fabrics, racks, {p.pk: rng.uniform(0.8, 1.25) for p in providers})


def _rack_sizes(rng: random.Random, hosts: int) -> list[int]:
    sizes = []
    while hosts > 0:
        sizes.append(min(hosts, rng.randint(16, 32)))
        hosts -= sizes[-1]
    return sizes


def _copy_hosts(cur, topo: Topology, rng: random.Random) -> list[tuple[int, str, int, int, str]]:
    """COPY the hosts, rack by rack (one GPU model per rack); returns (id, model, gpus, free, state) each."""
    from inventory.gpu_catalog import BY_MODEL
    from inventory.models import Host

    has_free_map = any(f.column == "free_gpu_map" for f in Host._meta.concrete_fields)
    columns, defaults = _columns_and_defaults(Host, HOST_COLUMNS + (["free_gpu_map"] if has_free_map else []))
    now = datetime.now(UTC)
    stamp = now.isoformat()
    plan: list[tuple[int, str, int, int, str]] = []
    buf = io.StringIO()
    with cur.cursor.copy(f"COPY inventory_host ({', '.join(columns)}) FROM STDIN") as copy:
        for block, size in topo.racks:
            fabric = block.fabric
            model = weighted(rng, MODELS_BY_FABRIC[fabric.kind])
            nvlink = BY_MODEL[model].nvlink
            count = 4 if model in FOUR_GPU_MODELS and rng.random() < 0.15 else 8
            rack_price = (
                BASE_PRICE[model]
                * topo.provider_factor[fabric.provider_id]
                * REGION_PRICE_FACTOR[fabric.site.region]
            )
            for _ in range(size):
                host_id = len(plan) + 1
                state = weighted(rng, HOST_STATE_WEIGHTS)
                free = _free_gpus(rng, state, count)
                heartbeat = (now - timedelta(seconds=rng.randint(5, 600))).isoformat()
                address = f"10.{host_id >> 16 & 255}.{host_id >> 8 & 255}.{host_id & 255}"
                buf.write(
                    f"{host_id}\t{fabric.provider_id}\t{fabric.site.name}-{host_id:06d}\t{fabric.site_id}\t"
                    f"{fabric.pk}\t{block.pk}\tssh\t{address}\t22\tvolt\t\t\t{{}}\t{state}\t"
                    f"{rack_price * rng.uniform(0.92, 1.08):.2f}\t{rng.uniform(0.9, 1.0):.4f}\t{heartbeat}\t"
                    f"{model}\t{count}\t{free}\t{count if nvlink else 1}\t\t\t{{}}\t\\N\t{stamp}\t{stamp}"
                )
                if has_free_map:  # free GPUs are indices 0..free-1, by NVLink domain
                    buf.write(
                        "\t"
                        + json.dumps([list(range(free))] if nvlink and free else [[i] for i in range(free)])
                    )
                buf.write(defaults + "\n")
                plan.append((host_id, model, count, free, state))
            if buf.tell() > COPY_CHUNK_CHARS:
                copy.write(buf.getvalue())
                buf = io.StringIO()
        copy.write(buf.getvalue())
    return plan


def _copy_gpus(cur, plan: list[tuple[int, str, int, int, str]], rng: random.Random) -> int:
    """COPY every host's GPUs: busy ones warm and utilised, one unhealthy GPU on each cordoned host."""
    from inventory.gpu_catalog import BY_MODEL
    from inventory.models import GPU

    columns, defaults = _columns_and_defaults(GPU, GPU_COLUMNS)
    n_gpus = 0
    buf = io.StringIO()
    with cur.cursor.copy(f"COPY inventory_gpu ({', '.join(columns)}) FROM STDIN") as copy:
        for host_id, model, count, free, state in plan:
            spec = BY_MODEL[model]
            for index in range(count):
                busy = index >= free
                buf.write(
                    f"{host_id}\t{index}\tGPU-{_uuid(rng)}\t{model}\t{spec.smi_name}\t{spec.memory_mib}\t"
                    f"{0 if spec.nvlink else index}\t00000000:{PCI_BUSES[index]:02X}:00.0\t"
                    f"{'unhealthy' if state == 'cordoned' and index == 0 else 'healthy'}\t"
                    f"{rng.randint(55, 78) if busy else rng.randint(28, 40)}\t{rng.randint(60, 100) if busy else 0}\t0"
                    f"{defaults}\n"
                )
            n_gpus += count
            if buf.tell() > COPY_CHUNK_CHARS:
                copy.write(buf.getvalue())
                buf = io.StringIO()
        copy.write(buf.getvalue())
    return n_gpus


def _columns_and_defaults(model, filled: list[str]) -> tuple[list[str], str]:
    """The COPY column list: `filled`, then the model's other columns with their defaults as one text suffix
    (a host's runtime: a ready one of Volt's pins, as an onboarded SSH host's; else it is never offered)."""
    others = [f for f in model._meta.concrete_fields if f.column not in filled and not f.primary_key]
    values = {f.column: f.get_default() for f in others}
    if model._meta.label == "inventory.Host":
        values["runtime"] = _ready_runtime()
    return filled + [f.column for f in others], "".join("\t" + _copy_text(values[f.column]) for f in others)


def _ready_runtime() -> dict:
    from inventory import host_runtime

    return {"state": "ready", "ready": True, "key": host_runtime.key(), "versions": host_runtime.pins(),
            "python_version": host_runtime.python_version()}  # fmt: skip


def _copy_text(value) -> str:
    if value is None:
        return "\\N"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, dict | list):
        return json.dumps(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def _free_gpus(rng: random.Random, state: str, count: int) -> int:
    """Realistic occupancy: a third of available hosts fully rented, a third idle, the rest partly."""
    if state == "available":
        roll = rng.random()
        if roll < 0.35:
            return 0
        if roll < 0.65:
            return count
        return rng.randint(1, count - 1)
    if state == "draining":
        return rng.randint(0, count)
    return 0


def _uuid(rng: random.Random) -> str:
    h = f"{rng.getrandbits(128):032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def existing_inventory() -> SeedResult:
    """What a kept database holds (--reuse)."""
    from django.db.models import Count

    from inventory.choices import ProviderStatus
    from inventory.models import GPU, Block, Fabric, Host, Provider, Site

    approved = list(
        Provider.objects.filter(status=ProviderStatus.APPROVED)
        .annotate(n=Count("hosts"))
        .order_by("n")
        .values_list("pk", flat=True)
    )
    if not approved:
        raise SystemExit("--reuse: the database holds no inventory; run once with --keep first")
    return SeedResult(
        hosts=Host.objects.count(),
        gpus=GPU.objects.count(),
        providers=Provider.objects.count(),
        sites=Site.objects.count(),
        fabrics=Fabric.objects.count(),
        blocks=Block.objects.count(),
        seconds=0.0,
        largest_approved_provider_id=approved[-1],
        median_approved_provider_id=approved[len(approved) // 2],
    )


# --- people ------------------------------------------------------------------------------------------


def make_users(seeded: SeedResult) -> dict[str, str]:
    """Bearer tokens of three personas: a researcher in a team; the admin of the largest approved provider;
    and a provider admin who also rents GPUs in a team (visible_hosts ORs both views for her)."""
    from django.contrib.auth import get_user_model

    from inventory.models import Provider
    from inventory.services import add_provider_admin
    from voltweb.services import add_member, create_api_token, create_team

    users = get_user_model().objects
    users.filter(username__in=["alice", "pat", "rita"]).delete()  # a reused database has them already
    team = create_team("Vision Lab", "vision-lab")
    alice = users.create_user("alice", "alice@vision.example", "bench-password")
    add_member(team, alice)
    pat = users.create_user("pat", "pat@provider.example", "bench-password")
    add_provider_admin(Provider.objects.get(pk=seeded.largest_approved_provider_id), pat)
    rita = users.create_user("rita", "rita@provider.example", "bench-password")
    add_member(team, rita)
    add_provider_admin(Provider.objects.get(pk=seeded.median_approved_provider_id), rita)
    return {
        who: create_api_token(user, "bench").secret
        for who, user in (("researcher", alice), ("provider_admin", pat), ("admin_researcher", rita))
    }


# --- measuring ---------------------------------------------------------------------------------------


def scenarios() -> dict[str, tuple[str, list[str]]]:
    """name -> (persona, the URLs its requests cycle through)."""
    regions = list(REGIONS)
    h100_prices = ["2.20", "2.50", "2.80", "3.10"]
    managed = ["", "?state=available", "?state=draining", "?ordering=-free_gpus", "?page=2"]
    return {
        "offers": ("researcher", ["/api/v1/offers/"]),
        "offers_region_infiniband": (
            "researcher",
            [f"/api/v1/offers/?region={r}&interconnect=infiniband" for r in regions],
        ),
        "hosts_h100_filtered": (
            "researcher",
            [
                f"/api/v1/hosts/?model=H100&region={r}&min_free_gpus=4&max_price={p}"
                for r in regions
                for p in h100_prices
            ],
        ),
        "hosts_a100_roce_page3": ("researcher", ["/api/v1/hosts/?model=A100&interconnect=roce&page=3"]),
        "hosts_unfiltered": ("researcher", ["/api/v1/hosts/"]),
        "gpus_h100_region": ("researcher", [f"/api/v1/gpus/?model=H100&region={r}" for r in regions]),
        "hosts_managed": ("provider_admin", [f"/api/v1/hosts/{q}" for q in managed]),
        "hosts_admin_researcher": (
            "admin_researcher",
            ["/api/v1/hosts/", "/api/v1/hosts/?model=H100&min_free_gpus=4"],
        ),
    }


def measure(name: str, client, urls: list[str], n_requests: int, n_warmup: int, explain: bool) -> dict:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def get(url: str):
        response = client.get(url)
        if response.status_code != 200:
            raise SystemExit(f"{name}: GET {url} answered {response.status_code}: {response.content[:300]!r}")
        return response

    for i in range(n_warmup):
        get(urls[i % len(urls)])
    with CaptureQueriesContext(connection) as ctx:
        get(urls[0])
    captured = list(ctx.captured_queries)  # read now: the next request resets the connection's query log
    if explain:
        _explain(name, captured)
    samples, rows, matched = [], [], []
    gc.collect()
    for i in range(n_requests):
        url = urls[i % len(urls)]
        t0 = time.perf_counter()
        response = client.get(url)
        samples.append((time.perf_counter() - t0) * 1000)
        if response.status_code != 200:
            raise SystemExit(f"{name}: GET {url} answered {response.status_code}")
        body = response.json()
        rows.append(len(body["results"]))
        matched.append(body["count"])
    return {
        **latency_summary(samples),
        "queries": len(captured),
        "rows": sorted(rows)[len(rows) // 2],
        "matched": sorted(matched)[len(matched) // 2],
    }


def _explain(name: str, queries: list[dict]) -> None:
    from django.db import connection

    print(f"\n=== {name}: {len(queries)} queries", flush=True)
    with connection.cursor() as cur:
        for q in queries:
            print(f"--- {float(q['time']) * 1000:.1f} ms: {q['sql'][:600]}")
            if not q["sql"].lstrip().upper().startswith("SELECT"):
                continue
            cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + q["sql"])
            print("\n".join("    " + r[0] for r in cur.fetchall()))


def main() -> None:
    args = parse_args()
    started = time.perf_counter()
    if not args.reuse:
        recreate_database(args.database_url)
    setup_django(args.database_url)
    from django.core.management import call_command
    from django.db import connection

    try:
        call_command("migrate", verbosity=0)
        seeded = existing_inventory() if args.reuse else seed(args.hosts, random.Random(args.seed))
        print(
            f"{'reused' if args.reuse else 'seeded'} {seeded.hosts:,} hosts, {seeded.gpus:,} GPUs, "
            f"{seeded.providers} providers, {seeded.sites} sites, {seeded.fabrics} fabrics, {seeded.blocks:,} racks "
            f"in {seeded.seconds:.1f} s",
            flush=True,
        )
        load_before = os.getloadavg()[0]
        results = run_scenarios(make_users(seeded), args)
        load_after = os.getloadavg()[0]
    finally:
        connection.close()
        if not (args.keep or args.reuse):
            recreate_database(args.database_url, drop_only=True)
    report(args, seeded, results, (load_before, load_after), time.perf_counter() - started)


def existing_page(client, url: str) -> str:
    """`url`, or on a small inventory (--hosts 1000) its last page where the page it names is past the end
    (the API answers 404 there). At the documented 100,000 hosts every scenario's page exists."""
    parts = urlsplit(url)
    query = dict(pair.split("=", 1) for pair in parts.query.split("&") if pair)
    if int(query.get("page", "1")) <= 1:
        return url
    first = {k: v for k, v in query.items() if k != "page"}
    count = client.get(
        urlunsplit(parts._replace(query="&".join(f"{k}={v}" for k, v in first.items())))
    ).json()["count"]
    last = max(1, -(-count // int(query.get("page_size", "50"))))
    if int(query["page"]) <= last:
        return url
    print(f"  {url}: only {last} page(s) at this size; timing page {last}", file=sys.stderr)
    return urlunsplit(parts._replace(query="&".join(f"{k}={v}" for k, v in {**query, "page": last}.items())))


def run_scenarios(tokens: dict[str, str], args: argparse.Namespace) -> dict[str, dict]:
    from django.test import Client

    clients = {who: Client(headers={"authorization": f"Bearer {secret}"}) for who, secret in tokens.items()}
    results = {}
    for name, (persona, urls) in scenarios().items():
        urls = [existing_page(clients[persona], url) for url in urls]
        results[name] = measure(name, clients[persona], urls, args.requests, args.warmup, args.explain)
        print(f"  {name}: p95 {results[name]['p95_ms']} ms", file=sys.stderr, flush=True)
    return results


def report(
    args: argparse.Namespace, seeded: SeedResult, results: dict, load: tuple[float, float], total_s: float
):
    met = all(r["p95_ms"] < TARGET_P95_MS for r in results.values())
    print(
        f"\n{args.requests} requests per scenario after {args.warmup} warm-up; target p95 < {TARGET_P95_MS} ms"
    )
    print_table(
        [{"scenario": k, **v} for k, v in results.items()],
        ["scenario", "p50_ms", "p95_ms", "max_ms", "queries", "rows", "matched"],
    )
    print(
        f"target met: {met}; total {total_s:.0f} s; 1-min load average {load[0]:.1f} before, "
        f"{load[1]:.1f} after timing ({os.cpu_count()} CPUs)"
    )
    emit_json(
        {
            "bench": "inventory",
            "hosts": seeded.hosts,
            "gpus": seeded.gpus,
            "seed_s": round(seeded.seconds, 1),
            "requests": args.requests,
            "scenarios": results,
            "target_p95_ms": TARGET_P95_MS,
            "met": met,
            "cpus": os.cpu_count(),
            "loadavg_1m": [round(load[0], 2), round(load[1], 2)],
        }
    )


if __name__ == "__main__":
    main()
