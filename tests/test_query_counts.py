"""Every list endpoint of the API and every list page of the console runs a fixed number of queries,
whatever the number of rows (CONVENTIONS.md: "pin query counts"; issue 22).

Each list is read twice: with a few rows of everything, then with `MORE` more rows of everything
(queued clusters with priorities, running clusters with nodes, jobs with events and checkpoints,
recoveries, hosts with GPUs and events, tokens, teams, providers, bandwidth samples). The count must
not move, and it is pinned: a new query per page shows up here as a changed number, on purpose.
"""

from __future__ import annotations

import itertools
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from clusters.choices import ClusterStatus
from clusters.models import (
    BandwidthSample,
    Cluster,
    ClusterEvent,
    ClusterNode,
    NodeHealth,
    Recovery,
    RecoveryJob,
)
from inventory import services as inventory
from inventory.choices import FabricKind, HostEventKind
from inventory.models import HostEvent
from jobs.choices import JobStatus
from jobs.models import Checkpoint, Job, JobEvent
from tests.conftest import api_client
from voltweb import services as accounts
from voltweb.choices import TeamRole

MORE = 12  # rows of everything added between the two reads (30 queued clusters with the first few)

_numbers = itertools.count(1)


class World:
    """One team's researcher, a provider's admin and a platform admin, and a way to add rows of everything."""

    def __init__(self, make_user, make_host):
        self.make_host = make_host
        self.team = accounts.create_team("Lab A", "lab-a")
        self.alice = make_user("alice")
        accounts.add_member(self.team, self.alice, TeamRole.ADMIN)
        self.priya = make_user("priya")
        self.root = make_user("root", is_staff=True, is_superuser=True)
        provider = inventory.register_provider(self.priya, "Northwind", "ops@northwind.example")
        self.provider = inventory.review_provider(provider, approve=True)
        site = inventory.get_or_create_site("iad1", "us-east")
        self.fabric = inventory.create_fabric(
            self.provider, site, "iad1-ib", FabricKind.IB_NDR, 400.0, 2.0, ["r01", "r02"]
        )
        self.block = self.fabric.blocks.order_by("name").first()
        self.hosts = []
        self.cluster = None  # a running cluster whose page lists nodes, events, jobs and recoveries
        self.job = None  # a job whose page lists events and checkpoints

    def grow(self, rows: int) -> None:
        for _ in range(rows):
            self.add_row()

    def add_row(self) -> None:
        n = next(_numbers)
        host = self.make_host(self.block, price="2.50")
        self.hosts.append(host)
        HostEvent.objects.create(host=host, kind=HostEventKind.STATE, message=f"event {n}")
        other = accounts.create_team(f"Team {n}", f"team-{n}")
        accounts.add_member(other, self.alice, TeamRole.RESEARCHER)
        for budget in (100 * n, 200 * n):  # a quota and two lines of its audit trail per team
            accounts.set_team_quota(
                other, self.root, max_gpus=16, gpu_model_caps={"H100": 8}, gpu_hours_per_month=budget
            )
        accounts.create_api_token(self.alice, f"token {n}")
        accounts.create_api_token(self.priya, f"token {n}")
        extra = inventory.register_provider(self.root, f"Provider {n}", f"ops{n}@example.com")
        inventory.review_provider(extra, approve=True)
        now = timezone.now()
        for priority in (0, 5):  # two queued clusters per row: positions need priority and FIFO order
            Cluster.objects.create(
                team=self.team,
                created_by=self.alice,
                name=f"queued-{n}-{priority}",
                status=ClusterStatus.QUEUED,
                priority=priority,
                spec={"nodes": 64, "gpus_per_node": 8, "gpu_models": ["H100"]},
                queued_at=now - timedelta(seconds=n),
                queue_reason="not enough H100 hosts",
            )
        cluster = Cluster.objects.create(
            team=self.team,
            created_by=self.alice,
            name=f"ready-{n}",
            status=ClusterStatus.READY,
            spec={"nodes": 1, "gpus_per_node": 8, "gpu_models": ["H100"]},
            gpu_model="H100",
            price_per_hour=Decimal("20.00"),
            ready_at=now,
        )
        node = ClusterNode.objects.create(cluster=cluster, host=host, rank=0, is_head=True, gpu_indices=[0])
        NodeHealth.objects.create(node=node)
        self.cluster = self.cluster or cluster
        head = self.cluster.nodes.first()
        ClusterNode.objects.create(cluster=self.cluster, host=host, rank=n, gpu_indices=[1])
        ClusterEvent.objects.create(cluster=self.cluster, message=f"event {n}", actor=self.alice)
        recovery = Recovery.objects.create(
            cluster=self.cluster, cause=f"node {head.rank} lost", failed_hosts=[]
        )
        BandwidthSample.objects.create(
            level="block", domain_id=str(self.block.pk), busbw_gbps=40.0 + n, cluster=self.cluster
        )
        for status in (JobStatus.RUNNING, JobStatus.SUCCEEDED):  # two jobs per row: 30 with the first few
            job = Job.objects.create(
                cluster=self.cluster,
                team=self.team,
                created_by=self.alice,
                name=f"job-{n}-{status}",
                entrypoint="python train.py",
                status=status,
            )
            self.job = self.job or job
            RecoveryJob.objects.create(
                recovery=recovery, job_id=job.pk, attempt=2, steps_lost=3, step_s=0.4, gpus=8,
                resubmitted_at=now, gpu_hours_lost=0.01,
            )  # fmt: skip
        JobEvent.objects.create(job=self.job, message=f"event {n}")
        Checkpoint.objects.create(job=self.job, step=n, path=f"ckpt/step-{n}", synchronized=True)


@pytest.fixture
def world(db, make_user, make_host):
    return World(make_user, make_host)


def api_queries(user, url: str) -> int:
    client = api_client(user)
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200, (url, response.status_code, response.content[:300])
    return len(queries)


def page_queries(user, url: str) -> int:
    client = Client()
    client.force_login(user)
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return len(queries)


# (who reads, URL, pinned query count). `{cluster}`, `{job}`, `{host}`, `{provider}` are filled in.
API_LISTS = [
    ("alice", "/api/v1/teams/", 4),
    ("alice", "/api/v1/tokens/", 2),
    ("root", "/api/v1/providers/", 2),
    ("alice", "/api/v1/sites/", 2),
    ("alice", "/api/v1/fabrics/", 5),
    ("alice", "/api/v1/blocks/", 4),
    ("priya", "/api/v1/hosts/", 4),
    ("priya", "/api/v1/hosts/{host}/events/", 6),
    ("priya", "/api/v1/gpus/", 4),
    ("alice", "/api/v1/offers/", 5),
    ("alice", "/api/v1/clusters/", 7),
    ("alice", "/api/v1/clusters/?status=queued", 3),
    ("alice", "/api/v1/clusters/{cluster}/events/", 8),
    ("alice", "/api/v1/clusters/{cluster}/recoveries/", 4),
    ("alice", "/api/v1/clusters/{cluster}/drills/", 3),
    ("alice", "/api/v1/jobs/", 2),
    ("alice", "/api/v1/jobs/{job}/events/", 3),
    ("alice", "/api/v1/jobs/{job}/checkpoints/", 3),
]

PAGES = [
    ("alice", "/account/tokens/", 4),
    # + quota use (GPUs in use, GPU-hours this month), the audit trail, and goodput by day (7, every team at once)
    ("alice", "/teams/", 16),
    ("root", "/teams/", 16),  # every team, with the quota form
    ("alice", "/inventory/", 6),
    ("priya", "/inventory/hosts/", 8),
    ("priya", "/inventory/hosts/{host}/", 11),
    ("root", "/inventory/providers/", 5),
    ("priya", "/inventory/providers/{provider}/", 13),
    ("alice", "/clusters/", 5),
    ("alice", "/clusters/overview/", 9),
    ("alice", "/clusters/{cluster}/", 21),  # + its goodput ledger (7: timeline, jobs, recoveries, GPUs)
    ("alice", "/jobs/", 5),
    ("alice", "/clusters/{cluster}/jobs/{job}/", 11),  # + its goodput ledger (5)
]


def _url(world: World, url: str) -> str:
    return url.format(
        cluster=world.cluster.pk, job=world.job.pk, host=world.hosts[0].pk, provider=world.provider.slug
    )


def queries_for_few_and_many_rows(world: World, read, who: str, url: str) -> tuple[int, int]:
    world.grow(3)
    few = read(getattr(world, who), _url(world, url))
    world.grow(MORE)
    return few, read(getattr(world, who), _url(world, url))


@pytest.mark.parametrize("who, url, pinned", API_LISTS, ids=[u for _, u, _ in API_LISTS])
def test_api_list_runs_the_same_queries_for_3_rows_as_for_15(world, who, url, pinned):
    assert queries_for_few_and_many_rows(world, api_queries, who, url) == (pinned, pinned)


@pytest.mark.parametrize("who, url, pinned", PAGES, ids=[u for _, u, _ in PAGES])
def test_list_page_runs_the_same_queries_for_3_rows_as_for_15(world, who, url, pinned):
    assert queries_for_few_and_many_rows(world, page_queries, who, url) == (pinned, pinned)
