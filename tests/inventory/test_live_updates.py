"""The host page's websocket: snapshot on connect, then every state change, only for allowed users."""

import pytest
from asgiref.sync import sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator

from inventory import services
from voltweb.routing import websocket_urlpatterns

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def communicator(user, host_id):
    app = URLRouter(websocket_urlpatterns)
    comm = WebsocketCommunicator(app, f"/ws/hosts/{host_id}/")
    comm.scope["user"] = user
    return comm


async def test_provider_admin_gets_snapshot_then_state_changes(
    priya, northwind, northwind_ib, add_local_host
):
    host = await sync_to_async(add_local_host)(northwind, northwind_ib, "live")
    comm = communicator(priya, host.pk)
    connected, _ = await comm.connect()
    assert connected
    assert await comm.receive_json_from(timeout=5) == {
        "kind": "snapshot",
        "state": "available",
        "free_gpus": 8,
        "gpu_count": 8,
    }

    await sync_to_async(services.act_on_host)(host, "cordon", priya, "fan failure")

    event = await comm.receive_json_from(timeout=5)
    assert event == {"kind": "state", "state": "cordoned", "reason": "fan failure"}
    await comm.disconnect()


async def test_other_provider_and_anonymous_are_refused(omar, northwind, northwind_ib, add_local_host):
    from django.contrib.auth.models import AnonymousUser

    host = await sync_to_async(add_local_host)(northwind, northwind_ib, "private", onboard=False)
    for user in (omar, AnonymousUser()):
        comm = communicator(user, host.pk)
        connected, code = await comm.connect()
        assert not connected and code == 4404


async def broadcast(host_id, event):
    """Send an event to the host's group exactly as the services do (after commit, through Redis)."""
    from voltweb import realtime

    await sync_to_async(realtime.broadcast)(f"host-{host_id}", event)


async def test_researcher_gets_only_what_the_api_shows_researchers(
    alice, priya, northwind, northwind_ib, add_local_host
):
    """Issue 9: every subscriber used to get the provider's reasons and the host's address."""
    host = await sync_to_async(add_local_host)(northwind, northwind_ib, "shared")
    researcher, admin = communicator(alice, host.pk), communicator(priya, host.pk)
    for comm in (researcher, admin):
        assert (await comm.connect())[0]
        assert (await comm.receive_json_from(timeout=5))["kind"] == "snapshot"

    private = {
        "kind": "state",
        "state": "available",
        "reason": f"rack fixed, {host.address} back (ticket 4411)",
    }
    await broadcast(host.pk, {"kind": "discovery", "message": f"connecting to {host.address}"})
    await broadcast(host.pk, private)

    assert await admin.receive_json_from(timeout=5) == {
        "kind": "discovery",
        "message": f"connecting to {host.address}",
    }
    assert await admin.receive_json_from(timeout=5) == private
    assert await researcher.receive_json_from(timeout=5) == {"kind": "state", "state": "available"}
    assert await researcher.receive_nothing(timeout=0.5)
    for comm in (researcher, admin):
        await comm.disconnect()


async def test_socket_closes_when_access_ends_and_the_reason_never_reaches_it(
    alice, priya, northwind, northwind_ib, add_local_host
):
    host = await sync_to_async(add_local_host)(northwind, northwind_ib, "leaving")
    comm = communicator(alice, host.pk)
    assert (await comm.connect())[0]
    await comm.receive_json_from(timeout=5)

    # Cordoned hosts are not shown to researchers: the socket ends instead of telling why.
    await sync_to_async(services.act_on_host)(host, "cordon", priya, "customer X saw ECC errors")

    assert await comm.receive_output(timeout=5) == {"type": "websocket.close", "code": 4404}


async def test_access_is_rechecked_when_the_user_is_deactivated(
    alice, northwind, northwind_ib, add_local_host
):
    host = await sync_to_async(add_local_host)(northwind, northwind_ib, "gone-user")
    comm = communicator(alice, host.pk)
    assert (await comm.connect())[0]
    await comm.receive_json_from(timeout=5)
    alice.is_active = False
    await sync_to_async(alice.save)()

    await broadcast(host.pk, {"kind": "state", "state": "available", "reason": "heartbeat"})

    assert await comm.receive_output(timeout=5) == {"type": "websocket.close", "code": 4404}
