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
