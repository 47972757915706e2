"""Issue 21 point 1: a websocket opened with an API token ends when the token does.

The periodic access re-check looked at team membership only: a socket opened with a token that was then
revoked kept streaming the cluster's events (14 messages in 72 s). The re-check now reads the token again
too (revoked, expired) and closes with the same code as lost access (4404).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.utils import timezone

from clusters.models import Cluster
from voltweb import realtime
from voltweb import services as accounts
from voltweb.models import ApiToken
from voltweb.routing import websocket_urlpatterns

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]
CLOSED = {"type": "websocket.close", "code": 4404}


@pytest.fixture
def recheck_at_once(settings):
    settings.VOLT_WS_RECHECK_S = 0.01  # every event past the first re-checks (jitter: 0.5 s-1.0 s times this)


@pytest.fixture
def cluster(team_a, alice):
    return Cluster.objects.create(
        team=team_a, created_by=alice, name="a1", status="ready",
        spec={"nodes": 1, "gpus_per_node": 1, "gpu_models": ["H100"]},
    )  # fmt: skip


def end_token(token: ApiToken, how: str) -> None:
    if how == "revoked":
        accounts.revoke_api_token(token)
    else:
        ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))


async def open_socket(path: str, secret: str) -> WebsocketCommunicator:
    comm = WebsocketCommunicator(
        URLRouter(websocket_urlpatterns), path, headers=[(b"authorization", f"Bearer {secret}".encode())]
    )
    connected, code = await comm.connect(timeout=10)
    assert connected, code
    return comm


async def event(cluster_id: int, seq: int) -> None:
    await sync_to_async(realtime.broadcast)(f"cluster-{cluster_id}", {"kind": "bench", "seq": seq})


@pytest.mark.parametrize("how", ["revoked", "expired"])
async def test_a_cluster_socket_opened_with_a_token_closes_within_one_recheck_once_it_ends(
    alice, cluster, recheck_at_once, how
):
    issued = await sync_to_async(accounts.create_api_token)(alice, "ws")
    comm = await open_socket(f"/ws/clusters/{cluster.pk}/", issued.secret)
    assert (await comm.receive_json_from(timeout=10))["kind"] == "snapshot"

    await sync_to_async(end_token)(issued.token, how)
    await event(cluster.pk, 1)  # the event that finds the re-check due

    assert (await comm.receive_json_from(timeout=10))["seq"] == 1
    assert await comm.receive_output(timeout=10) == CLOSED


async def test_a_revoked_token_gets_no_snapshot_on_request(alice, cluster, recheck_at_once):
    """Asking for a fresh snapshot is answered only while the token is still good."""
    issued = await sync_to_async(accounts.create_api_token)(alice, "ws")
    comm = await open_socket(f"/ws/clusters/{cluster.pk}/", issued.secret)
    await comm.receive_json_from(timeout=10)

    await sync_to_async(end_token)(issued.token, "revoked")
    await comm.send_json_to({"kind": "snapshot"})

    assert await comm.receive_output(timeout=10) == CLOSED


async def test_a_live_token_keeps_its_socket_through_rechecks(alice, cluster, recheck_at_once):
    issued = await sync_to_async(accounts.create_api_token)(alice, "ws")
    comm = await open_socket(f"/ws/clusters/{cluster.pk}/", issued.secret)
    await comm.receive_json_from(timeout=10)

    for seq in range(3):
        await event(cluster.pk, seq)
        assert (await comm.receive_json_from(timeout=10))["seq"] == seq
    assert await comm.receive_nothing(timeout=0.5)
    await comm.disconnect()


async def test_the_overview_socket_closes_once_its_token_is_revoked(alice, cluster):
    issued = await sync_to_async(accounts.create_api_token)(alice, "ws")
    comm = await open_socket("/ws/overview/", issued.secret)
    assert (await comm.receive_json_from(timeout=10))["kind"] == "overview"

    await sync_to_async(end_token)(issued.token, "revoked")
    await sync_to_async(realtime.overview_changed)("test")  # the next recompute re-reads the token

    assert await comm.receive_output(timeout=10) == CLOSED


async def test_the_host_socket_takes_a_token_and_closes_once_it_is_revoked(
    priya, northwind, northwind_ib, add_local_host
):
    """Issue 22: of three consumers only the cluster's accepted API tokens; a provider admin's CI could not
    follow a host. Now every socket authenticates the same way (voltweb.consumers.VoltConsumer), and the
    host socket, which re-authorizes every event, ends with the token."""
    from inventory import services as inventory

    host = await sync_to_async(add_local_host)(northwind, northwind_ib, "ws-token")
    issued = await sync_to_async(accounts.create_api_token)(priya, "ws")
    comm = await open_socket(f"/ws/hosts/{host.pk}/", issued.secret)
    assert (await comm.receive_json_from(timeout=10))["kind"] == "snapshot"

    await sync_to_async(inventory.act_on_host)(host, "cordon", priya, "fan failure")
    assert (await comm.receive_json_from(timeout=10))["state"] == "cordoned"

    await sync_to_async(end_token)(issued.token, "revoked")
    await sync_to_async(inventory.act_on_host)(host, "uncordon", priya, "fixed")

    assert await comm.receive_output(timeout=10) == CLOSED
