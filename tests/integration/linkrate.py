"""Measure one emulated link: a receiver here on `dst`, a sender process that runs as a local host's
process would (the source-address shim preloaded, VOLT_HOST_ADDRESS set) and sends for a while."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

_SENDER = """
import socket, sys, time
dst, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
chunk = b"x" * 65536
with socket.create_connection((dst, port)) as sock:
    print(sock.getsockname()[0], flush=True)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sock.sendall(chunk)
"""


def measure_bytes_per_s(
    src: str | None, dst: str, preload: Path | None, seconds: float = 2.0
) -> tuple[float, str]:
    """(bytes/s received on dst after a 0.5 s start-up, the sender's source address). `src=None`: a plain
    process (no shim), as Volt's own processes connect."""
    server = socket.create_server((dst, 0))
    port = server.getsockname()[1]
    received: list[tuple[float, int]] = []

    def receive() -> None:
        conn, _ = server.accept()
        with conn:
            total = 0
            while data := conn.recv(1 << 20):
                total += len(data)
                received.append((time.monotonic(), total))

    thread = threading.Thread(target=receive, daemon=True)
    thread.start()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    if src is not None:
        env.update({"VOLT_HOST_ADDRESS": src, "LD_PRELOAD": str(preload)})
    sender = subprocess.run(
        [sys.executable, "-c", _SENDER, dst, str(port), str(seconds)],
        env=env,
        capture_output=True,
        text=True,
        timeout=seconds + 60,
    )
    thread.join(timeout=30)
    server.close()
    assert sender.returncode == 0, sender.stderr
    start = next(((t, n) for t, n in received if t >= received[0][0] + 0.5), received[0])
    end = received[-1]
    return (end[1] - start[1]) / max(end[0] - start[0], 1e-6), sender.stdout.strip()
