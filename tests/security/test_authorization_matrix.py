"""Issue 9 acceptance: every route of the URLconf, every operation of the OpenAPI schema and every
websocket route, as every role, against another tenant's objects — answered as docs/architecture.md
"Visibility" says: 401 (API) or a redirect to sign-in (console) for anonymous callers, 404/403 (400 for a
create naming another tenant's object) for roles the object is not for, never a 500.

Routes come from django.urls.get_resolver(), the schema from drf-spectacular and websockets from
voltweb.routing, not from a list kept here: a route that matrix_rules.ROUTES does not describe, or whose
URL the matrix cannot fill, fails the test. Roles that may use an object are sent only reads (and
previews): what owners do with their objects is the feature tests' business.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import pytest
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, resolve
from drf_spectacular.generators import SchemaGenerator

from clusters.models import Cluster
from inventory.choices import HostState
from jobs.models import Job
from tests.conftest import api_client
from tests.security.matrix_rules import ROLES, ROUTES, TARGETS, WS_ROUTES, Rule
from voltweb import services as accounts
from voltweb.routing import websocket_urlpatterns

SAFE = ("GET", "HEAD")
DENIED_API = {403, 404}
DENIED_CREATE = {400, 403}
DENIED_CONSOLE = {403, 404}


@dataclass
class Route:
    key: str
    regex: str
    pattern: URLPattern

    @property
    def is_api(self) -> bool:
        return self.key.startswith("api:")


def walk(patterns, prefix: str = "", namespace: str | None = None):
    for entry in patterns:
        regex = prefix + entry.pattern.regex.pattern.lstrip("^")
        if isinstance(entry, URLResolver):
            inner = ":".join(n for n in (namespace, entry.namespace) if n) or None
            yield from walk(entry.url_patterns, regex, inner)
        else:
            yield namespace, entry, regex


def route_key(namespace: str | None, pattern: URLPattern, regex: str) -> str:
    name = f"{namespace}:{pattern.name}" if namespace and pattern.name else pattern.name
    if regex.startswith("api/"):
        return f"api:{name}"
    if namespace == "admin" and name not in ROUTES:
        return "admin"
    return name or regex


def all_routes() -> list[Route]:
    return [Route(route_key(ns, p, rx), rx, p) for ns, p, rx in walk(get_resolver().url_patterns)]


# --- filling a route's URL -------------------------------------------------------------------------------

FIXED = {"action": "cordon", "app_label": "inventory", "content_type_id": "1", "object_id": "1", "id": "1"}


def fill(regex: str, values: dict[str, str]) -> str:
    """The URL path a pattern's regex matches with `values` for its named groups."""
    out, i = [], 0
    while i < len(regex):
        match = re.match(r"\(\?P<(\w+)>", regex[i:])
        if match:
            name, depth, j = match.group(1), 1, i + match.end()
            while depth:
                depth += {"(": 1, ")": -1}.get(regex[j], 0) if regex[j - 1] != "\\" else 0
                j += 1
            inner = regex[i + match.end() : j - 1]
            if name == "format":
                values = values | {"format": ".json" if inner.startswith("\\.") else "json"}
            if name not in values:
                raise LookupError(f"the matrix does not know how to fill <{name}>")
            out.append(str(values[name]))
            i = j
            continue
        out.append(regex[i])
        i += 1
    path = "".join(out)
    for token, text in (("\\Z", ""), ("$", ""), ("/?", "/"), ("\\.", "."), (".*", "nope/")):
        path = path.replace(token, text)
    return "/" + path


# --- the world: another tenant's objects ------------------------------------------------------------------


@pytest.fixture
def world(alice, bob, priya, omar, helios, root, make_user, team_a, northwind_ib, make_host):
    block = northwind_ib.blocks.first()
    make_host(block)  # an available host: researchers see it, and previews can plan
    private = make_host(block, state=HostState.ONBOARDING)
    cluster = Cluster.objects.create(
        team=team_a,
        created_by=alice,
        name="a1",
        spec={"nodes": 1, "gpus_per_node": 1, "gpu_models": ["H100"]},
    )
    job = Job.objects.create(
        cluster=cluster, team=team_a, created_by=alice, name="j1", entrypoint="python t.py"
    )
    job.checkpoints.create(path="/storage/jobs/1/checkpoints/step-00000010", step=10, synchronized=True)
    objects = {
        "cluster": {"pk": cluster.pk, "cluster_id": cluster.pk},
        "job": {"pk": job.pk, "cluster_id": cluster.pk},
        "job_checkpoint": {"pk": job.pk, "step": 10},
        "cluster_secret": {"pk": cluster.pk},
        "cluster_code": {"pk": cluster.pk, "cluster_id": cluster.pk},
        "cluster_admin": {"pk": cluster.pk, "cluster_id": cluster.pk},
        "team": {"pk": team_a.pk},
        "team_quota": {"pk": team_a.pk},
        "token": {"pk": accounts.create_api_token(priya, "priya's").token.pk},
        "private_host": {"pk": private.pk, "host_id": private.pk},
        "private_gpu": {"pk": private.gpus.first().pk},
        "provider": {"slug": northwind_ib.provider.slug, "pk": northwind_ib.provider.pk},
        "manage_provider": {"slug": northwind_ib.provider.slug},
        "platform_admin": {"slug": northwind_ib.provider.slug},
        "fabric": {"pk": northwind_ib.pk},
        "block": {"pk": block.pk},
        "site": {"pk": northwind_ib.site_id},
    }
    users = {
        "alice": alice,
        "bob": bob,
        "omar": omar,
        "root": root,
        "fresh": make_user("fresh"),
        "anonymous": None,
    }
    return {
        "objects": objects,
        "users": users,
        "refs": {
            "$site": northwind_ib.site_id,
            "$block": block.pk,
            "$cluster": cluster.pk,
            "$host": private.pk,
        },
    }


def client_as(world, role: str, api: bool):
    user = world["users"][role]
    if api:
        return api_client(token=accounts.create_api_token(user, "matrix").secret) if user else api_client()
    client = Client()
    if user:
        client.force_login(user)
    return client


# --- what each role must get ------------------------------------------------------------------------------


def methods_of(route: Route, rule: Rule) -> list[str]:
    """API routes: the methods the view really serves (not a list kept here). Console: the rule's."""
    func = route.pattern.callback
    actions = getattr(func, "actions", None)
    if actions:
        return sorted(m.upper() for m in actions if m not in ("options", "head"))
    cls = getattr(func, "cls", None)
    if route.is_api and cls is not None:
        return sorted(
            m.upper()
            for m in cls.http_method_names
            if m not in ("options", "head", "trace") and hasattr(cls, m)
        )
    return list(rule.methods)


def is_collection_create(route: Route, method: str) -> bool:
    return method == "POST" and (getattr(route.pattern.callback, "actions", {}) or {}).get("post") == "create"


def expectation(route: Route, rule: Rule, method: str, role: str) -> str:
    target = rule.create if is_collection_create(route, method) and rule.create else rule.target
    if rule.target == "nobody":
        return "not_found"
    if role in TARGETS[target].allowed:
        return "allowed"
    if role == "anonymous":
        return "sign_in"
    return "denied_create" if is_collection_create(route, method) else "denied"


def login_redirect(response, admin: bool) -> bool:
    where = response.get("Location", "")
    return response.status_code == 302 and where.startswith("/admin/login/" if admin else "/login/")


def check(route: Route, rule: Rule, method: str, role: str, response) -> str | None:
    """None if `response` is what `role` must get, else what is wrong."""
    status, admin = response.status_code, route.key.startswith("admin")
    wanted = expectation(route, rule, method, role)
    if status >= 500:
        return f"server error {status}"
    if wanted == "not_found":
        ok = status == 404
    elif wanted == "allowed" and route.key == "admin":
        ok = not login_redirect(response, admin)  # the admin's own 403/404 for the matrix's filler ids
    elif wanted == "allowed":
        ok = status not in (401, 403, 404) and (
            rule.target == "public" or not login_redirect(response, admin)
        )
    elif wanted == "sign_in":
        ok = status == 401 if route.is_api else login_redirect(response, admin)
    elif admin:
        ok = login_redirect(response, admin=True)
    elif wanted == "denied_create":
        ok = status in DENIED_CREATE
    else:
        ok = status in (DENIED_API if route.is_api else DENIED_CONSOLE)
    return None if ok else f"expected {wanted}, got {status} {response.get('Location', '')}"


def body_for(rule: Rule, world) -> dict:
    def fill_ref(value):
        if isinstance(value, list):
            return [fill_ref(item) for item in value]
        return world["refs"].get(value, value) if isinstance(value, str) else value

    return {key: fill_ref(value) for key, value in rule.body.items()}


def send(client, route: Route, method: str, path: str, rule: Rule, world):
    if method == "GET":
        return client.get(path)
    data = body_for(rule, world)
    if route.is_api:
        return client.generic(method, path, data=json.dumps(data), content_type="application/json")
    return client.post(path, data)


# --- the tests --------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_every_route_answers_every_role_as_the_visibility_rules_say(world):
    problems, exercised = [], 0
    clients = {(role, True): client_as(world, role, api=True) for role in ROLES}
    for route in all_routes():
        rule = ROUTES.get(route.key)
        if rule is None:
            problems.append(
                f"{route.key} ({route.regex}): not in matrix_rules.ROUTES — decide who may use it"
            )
            continue
        values = FIXED | world["objects"].get(rule.target, {}) | {"url": "nope/"}
        try:
            path = fill(route.regex, values)
        except LookupError as exc:
            problems.append(f"{route.key} ({route.regex}): {exc}")
            continue
        if resolve(path).func is not route.pattern.callback and route.key != "admin":
            problems.append(f"{route.key}: the filled URL {path} resolves elsewhere")
            continue
        for method in methods_of(route, rule):
            for role in ROLES:
                wanted = expectation(route, rule, method, role)
                if wanted == "allowed" and method not in SAFE and not rule.safe_posts:
                    continue  # the owner acting on their own object: feature tests cover it
                # Console: a fresh session per request (the matrix signs out through /logout/ too).
                client = clients[(role, True)] if route.is_api else client_as(world, role, api=False)
                response = send(client, route, method, path, rule, world)
                exercised += 1
                problem = check(route, rule, method, role, response)
                if problem:
                    problems.append(f"{method} {path} as {role}: {problem}")
                elif rule.hidden_in_list and method == "GET" and response.status_code == 200:
                    problems += hidden_problems(rule, role, path, response, world)
    assert not problems, f"{len(problems)} of {exercised} requests broke the rules:\n" + "\n".join(problems)
    assert exercised > 500


def hidden_problems(rule: Rule, role: str, path: str, response, world) -> list[str]:
    """A collection lists another tenant's object only to roles that may see it."""
    if role in TARGETS[rule.hidden_in_list].allowed:
        return []
    target = world["objects"][rule.hidden_in_list]["pk"]
    ids = [row["id"] for row in response.json()["results"]]
    return [f"GET {path} as {role}: lists {rule.hidden_in_list} {target}"] if target in ids else []


@pytest.mark.django_db
def test_every_schema_operation_is_a_route_the_matrix_covers():
    schema = SchemaGenerator().get_schema(request=None, public=True)
    problems = []
    for path, operations in schema["paths"].items():
        concrete = re.sub(r"\{[^}]+\}", "1", path)
        match = resolve(concrete)
        route = next((r for r in all_routes() if r.pattern.callback is match.func), None)
        if route is None or route.key not in ROUTES:
            problems.append(f"{path}: no route of the matrix serves it")
            continue
        served = methods_of(route, ROUTES[route.key])
        problems += [f"{m.upper()} {path}: not exercised" for m in operations if m.upper() not in served]
    assert not problems, "\n".join(problems)
    assert len(schema["paths"]) > 20


def ws_path(route: str, values: dict) -> str:
    if not route:
        return "/ws/nope/"  # the catch-all: any path no other route takes
    return "/" + re.sub(r"<(?:\w+:)?(\w+)>", lambda m: str(values[m.group(1)]), route)


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_every_websocket_route_answers_every_role(world):
    problems = []
    for pattern in websocket_urlpatterns:
        key = str(pattern.pattern)
        key = "" if key in ("", "^") else key
        if key not in WS_ROUTES:
            problems.append(f"websocket {key!r}: not in matrix_rules.WS_ROUTES")
            continue
        target = WS_ROUTES[key]
        path = ws_path(key, world["objects"].get(target, {}))
        for role in ROLES:
            user = world["users"][role] or AnonymousUser()
            comm = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path)
            comm.scope["user"] = user
            connected, code = await comm.connect(timeout=5)
            allowed = role in TARGETS[target].allowed
            if connected != allowed or (not connected and code != 4404):
                problems.append(f"ws {path} as {role}: connected={connected} code={code}, allowed={allowed}")
            await comm.disconnect()
    assert not problems, "\n".join(problems)
