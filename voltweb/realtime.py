"""Push an event to a Channels group from any process (web, Celery worker), after commit."""

from __future__ import annotations

import json
import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction

logger = logging.getLogger(__name__)


def broadcast(group: str, event: dict) -> None:
    """Send `event` to every websocket in `group` once the current transaction commits.

    Losing a live update must never fail the operation that caused it: pages take a fresh snapshot
    on (re)connect, so an error here is logged and dropped.
    """

    def send() -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        try:
            # Encoded once here, not once per subscriber: sockets that forward as is send `text`.
            text = json.dumps(event, cls=DjangoJSONEncoder)
            async_to_sync(layer.group_send)(group, {"type": "volt.event", "event": event, "text": text})
        except Exception:  # noqa: BLE001 - see docstring
            logger.warning("broadcast to %s failed", group, exc_info=True)

    transaction.on_commit(send)


#: The health overview's group: every overview page listens; each recomputes what its user may see.
OVERVIEW_GROUP = "overview"


def overview_changed(what: str) -> None:
    """Tell overview pages that counts may have moved (a cluster status, a node verdict, a host state).

    The event carries no data: each overview socket recomputes its own user's view (teams, providers)."""
    broadcast(OVERVIEW_GROUP, {"kind": "changed", "what": what})
