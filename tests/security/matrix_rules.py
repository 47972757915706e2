"""The authorization rules the matrix test (test_authorization_matrix.py) holds every route to.

Each route of the URLconf is named here by its key (`name`, `ns:name` for namespaced console pages,
`api:name` for /api/ routes, `admin` for the admin site) with the object it is about and who may reach
that object, as docs/architecture.md "Visibility" says. A route missing from ROUTES fails the matrix:
adding an endpoint means deciding here who may use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ROLES = ("anonymous", "alice", "bob", "omar", "root", "fresh")
AUTHENTICATED = frozenset(ROLES) - {"anonymous"}
RESEARCHERS = frozenset({"alice", "bob"})


@dataclass(frozen=True)
class Target:
    """Another tenant's object a route is about, and the roles that may reach it."""

    allowed: frozenset[str]


# The objects (built by the matrix's `world` fixture): all belong to team A (alice's) or to Northwind
# (priya's provider); bob is on team B, omar admin of Helios, fresh on no team, root a platform admin.
TARGETS = {
    "page": Target(AUTHENTICATED),  # a page or collection: anyone signed in (contents filtered)
    "public": Target(frozenset(ROLES)),  # sign-in page, health check, API schema and docs
    "nobody": Target(frozenset()),  # the API's catch-all 404
    "cluster": Target(frozenset({"alice", "root"})),  # team A's cluster
    "cluster_secret": Target(frozenset({"alice"})),  # its SSH key: team members only, not platform admins
    # Running code on it (submitting a job reads its Ray token and storage): team members only, as its key.
    "cluster_code": Target(frozenset({"alice"})),
    # Fault drills and the recovery policy: platform admins and team A's admins (alice is a researcher).
    "cluster_admin": Target(frozenset({"root"})),
    "team": Target(frozenset({"alice", "root"})),  # team A
    "team_quota": Target(frozenset({"root"})),  # setting team A's quota: platform admins
    "token": Target(frozenset()),  # priya's API token: its owner's alone (not even a platform admin's)
    "private_host": Target(
        frozenset({"root"})
    ),  # a Northwind host still onboarding (hidden from researchers)
    "private_gpu": Target(frozenset({"root"})),  # a GPU of that host
    "provider": Target(RESEARCHERS | {"root"}),  # Northwind (approved: researchers see it)
    "fabric": Target(RESEARCHERS | {"root"}),  # a Northwind fabric
    "block": Target(RESEARCHERS | {"root"}),  # a block of that fabric
    "site": Target(AUTHENTICATED),  # sites are shared by every provider
    "manage_provider": Target(frozenset({"root"})),  # acting for Northwind (priya and platform admins)
    "platform_admin": Target(frozenset({"root"})),  # approving providers, the admin site
    "provider_admins": Target(frozenset({"omar", "root"})),  # adding a site: any provider admin
    "team_member": Target(frozenset({"alice", "bob", "root"})),  # placement preview
    "as_team_a": Target(frozenset({"alice", "root"})),  # creating a cluster for team A
    "job": Target(frozenset({"alice", "root"})),  # a job on team A's cluster: visible as its cluster is
    # Downloading one of its checkpoints (the team's data): team members only, not platform admins.
    "job_checkpoint": Target(frozenset({"alice"})),
}


@dataclass(frozen=True)
class Rule:
    target: str
    methods: tuple[str, ...] = ("GET",)  # console routes (API routes take their methods from the view)
    # POSTs that change nothing (previews) are sent as every role, like GETs.
    safe_posts: bool = False
    body: dict = field(default_factory=dict)  # body for POST; "$site"/"$block" are filled from the world
    hidden_in_list: str | None = None  # the collection must not list this target to roles not allowed
    create: str | None = None  # the target of a POST to this collection (who may create), if not `target`


R = Rule
ROUTES: dict[str, Rule] = {
    # --- console ---------------------------------------------------------------------------------------
    "home": R("public"),  # a redirect to the offers page, which asks for a sign-in
    "login": R("public"),
    "logout": R("public", methods=("POST",), safe_posts=True),
    "tokens": R("page", methods=("GET", "POST"), body={"name": "matrix"}),  # creates one's own token
    "token-revoke": R("token", methods=("POST",)),
    "teams": R("page"),
    # Setting a team's quota from the teams page: platform admins only (team A's member alice gets 403).
    "team-quota": R("team_quota", methods=("POST",), body={"max_gpus": "8"}),
    "inventory:offers": R("page"),
    "inventory:hosts": R("page"),
    "inventory:host": R("private_host"),
    "inventory:host-status": R("private_host"),
    "inventory:host-action": R("private_host", methods=("POST",), body={"reason": "matrix"}),
    "inventory:providers": R("page"),
    "inventory:provider-new": R("page"),
    "inventory:provider": R("provider"),
    "inventory:provider-review": R("platform_admin", methods=("POST",), body={"decision": "approve"}),
    "inventory:fabric-new": R("manage_provider", methods=("GET", "POST")),
    "inventory:host-new": R("manage_provider", methods=("GET", "POST")),
    "clusters:list": R("page"),
    "clusters:new": R("page"),
    "clusters:preview": R(
        "page",
        methods=("POST",),
        safe_posts=True,
        body={"nodes": 1, "gpus_per_node": 1, "gpu_models": "H100"},
    ),
    "clusters:detail": R("cluster"),
    "clusters:terminate": R("cluster", methods=("POST",)),
    # Extending a cluster's duration commits the team's GPUs: team members only, as its key.
    "clusters:extend": R("cluster_secret", methods=("POST",), body={"hours": "1"}),
    "clusters:probe": R("cluster", methods=("POST",)),
    "clusters:drill": R("cluster_admin", methods=("POST",), body={"drill": "kill_processes", "rank": 0}),
    "clusters:overview": R("page"),
    "jobs:list": R("page"),
    "jobs:new": R(
        "cluster_code",
        methods=("GET", "POST"),
        body={"kind": "demo", "steps": 5, "seed": 0, "checkpoint_every": 2},
    ),  # fmt: skip
    "jobs:detail": R("job"),
    "jobs:log": R("job"),  # the whole stored log as a file: whoever may see the job
    "jobs:stop": R("job", methods=("POST",)),
    "inventory:host-faults": R("private_host", methods=("POST",), body={"fault": "hot"}),
    "inventory:host-runtime": R("private_host", methods=("POST",)),
    "healthz": R("public"),
    "admin": R("platform_admin"),  # every page of the admin site but these two:
    "admin:login": R("public"),
    "admin:logout": R("public", methods=("POST",), safe_posts=True),
    # --- API -------------------------------------------------------------------------------------------
    "api:api-root": R("page"),
    "api:schema": R("public"),
    "api:api-docs": R("public"),
    "api:api-redoc": R("public"),
    "api:api-not-found": R("nobody", methods=("GET", "POST")),
    "api:team-list": R("page", hidden_in_list="team"),
    "api:team-detail": R("team"),
    # Read by whoever sees the team; PUT/PATCH by platform admins only (alice's 403: tests/clusters/test_quotas.py).
    "api:team-quota": R("team", body={"max_gpus": 8}),
    "api:token-list": R("page", body={"name": "matrix"}, hidden_in_list="token"),  # POST: one's own
    "api:token-detail": R("token"),
    "api:token-revoke": R("token"),
    "api:provider-list": R("page", body={"name": "Matrix Cloud"}, hidden_in_list="provider"),  # POST: anyone
    "api:provider-detail": R("provider"),
    "api:provider-approve": R("platform_admin"),
    "api:provider-suspend": R("platform_admin"),
    "api:site-list": R("page", create="provider_admins", body={"name": "mtx1", "region": "matrix"}),
    "api:site-detail": R("site"),
    "api:fabric-list": R(
        "page",
        create="manage_provider",
        body={"provider": "northwind", "site": "$site", "name": "mtx", "kind": "roce"},
        hidden_in_list="fabric",
    ),
    "api:fabric-detail": R("fabric"),
    "api:block-list": R("page", hidden_in_list="block"),
    "api:block-detail": R("block"),
    "api:host-list": R(
        "page",
        create="manage_provider",
        body={
            "provider": "northwind",
            "name": "matrix",
            "block": "$block",
            "driver": "ssh",
            "address": "10.99.0.1",
            "ssh_user": "volt",
            "price_per_gpu_hour": "1.00",
        },
        hidden_in_list="private_host",
    ),
    "api:host-detail": R("private_host"),
    "api:host-events": R("private_host"),
    "api:host-cordon": R("private_host"),
    "api:host-drain": R("private_host"),
    "api:host-uncordon": R("private_host"),
    "api:host-retire": R("private_host"),
    "api:host-rediscover": R("private_host"),
    "api:host-faults": R("private_host", body={"fault": "hot"}),
    "api:host-runtime": R("private_host"),
    # Measured figures a provider uploads for its hosts (issue 23): the hosts' provider admins and platform
    # admins; everyone else is refused (403, or 400 for a host they do not manage).
    "api:bandwidth-sample-list": R(
        "page",
        create="manage_provider",
        body={"hosts": ["$host"], "output": "# nThread 1 nGpus 8 minBytes 8 maxBytes 8"},
    ),
    "api:gpu-list": R("page", hidden_in_list="private_gpu"),
    "api:gpu-detail": R("private_gpu"),
    "api:offer-list": R("page"),
    "api:placement-preview": R(
        "team_member", safe_posts=True, body={"nodes": 1, "gpus_per_node": 1, "gpu_models": ["H100"]}
    ),
    "api:cluster-list": R(
        "page",
        create="as_team_a",
        body={"team": "lab-a", "nodes": 1, "gpus_per_node": 1, "gpu_models": ["H100"]},
        hidden_in_list="cluster",
    ),
    "api:cluster-detail": R("cluster"),
    "api:cluster-events": R("cluster"),
    "api:cluster-ssh-key": R("cluster_secret"),
    "api:cluster-telemetry-metrics": R("cluster"),
    "api:cluster-telemetry-probe": R("cluster"),
    "api:cluster-telemetry-probe-settings": R("cluster", body={"probe_interval_min": 10}),
    "api:cluster-terminate": R("cluster"),
    "api:cluster-extend": R("cluster_secret", body={"seconds": 3600}),
    "api:goodput-list": R("page"),  # anyone signed in: their teams' clusters only
    "api:goodput-cluster": R("cluster"),
    "api:cluster-recovery-recoveries": R("cluster"),
    "api:cluster-recovery-drills": R("cluster_admin", body={"drill": "kill_processes", "rank": 0}),
    "api:cluster-recovery-recovery-policy": R("cluster_admin", body={"recovery_policy": "shrink"}),
    "api:job-list": R(
        "page", create="cluster_code", body={"cluster": "$cluster", "demo": True}, hidden_in_list="job"
    ),
    "api:job-detail": R("job"),
    "api:job-logs": R("job"),
    "api:job-stop": R("job"),
    "api:job-checkpoints": R("job"),
    "api:job-checkpoint-download": R("job_checkpoint"),
    "api:job-events": R("job"),
    "api:job-goodput": R("job"),
}

# Websocket routes (voltweb.routing): the route's path -> target.
# ws/overview/: anyone signed in; what it sends is filtered per user (test_overview_live.py checks that a
# provider admin's host health holds their hosts only).
WS_ROUTES = {
    "ws/hosts/<int:host_id>/": "private_host",
    "ws/clusters/<int:cluster_id>/": "cluster",
    "ws/overview/": "page",
    "": "nobody",
}
