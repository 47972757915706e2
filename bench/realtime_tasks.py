"""The Celery task bench/realtime.py publishes with: one cluster event carrying its send time.

Loaded into a real worker with `celery -A voltweb worker --include realtime_tasks` (PYTHONPATH=bench).
"""

import time

from voltweb import realtime
from voltweb.celery import app


@app.task(name="bench.emit_cluster_event")
def emit_cluster_event(cluster_id: int, seq: int) -> None:
    """Broadcast a `bench` event to the cluster's websocket group, stamped with the wall clock."""
    realtime.broadcast(f"cluster-{cluster_id}", {"kind": "bench", "seq": seq, "sent": time.time()})
