"""The lab's gate: how the root namespace reaches each machine's sshd without touching a lab address.

    Volt (root namespace) ──TCP──▶ 127.77.<lab>.<n>:22 ┐ one gate process per lab: its listening sockets
                                                       │ were made in the root namespace, then the process
                                                       │ moved itself into the router namespace (setns);
                                                       └─▶ connects there to 10.77.p.k:22 over the bridge

A socket keeps the network namespace it was created in, so the gate binds every machine's loopback gate
first and only then joins the router namespace, where all its outgoing connections are made: nothing in
the root namespace targets a lab address, and a machine reached through its gate is reached over its
own cable (unplugged, its gate answers nothing; powered off, nothing listens). Being in the router's
namespace, the gate is among that namespace's processes, so a crashed lab's gate is found there even if
the state file never recorded it.

The same gate, turned round (`--back`), lets control machines (`"role": "control"`) reach the control
plane's PostgreSQL and Redis without anything in the root namespace targeting a lab address (and, with
`--open-back`, every machine reach the checkpoint store's S3 API, which checks each cluster's key itself):

    control machine ──TCP──▶ 10.77.0.1:5432 (an address on the router namespace's lo, where the gate's
                             back sockets listen; only the `--allow`ed source addresses are served)
                             └─▶ a socket made in the gate's first namespace (the root one, held open as a
                                 file) connects to 127.0.0.1:5432 there

Run as `python -m inventory.lab.gate --netns /run/netns/NAME --log FILE LISTEN=TARGET ... [--back
LISTEN=TARGET --allow ADDRESS ...]` (LISTEN and TARGET are ADDRESS:PORT). It prints `ready` (or `error: …`)
on stdout once it serves, then logs to FILE. Standard library only.

Inside a control machine the same module runs with `--netns /proc/self/ns/net` (no move): it gives the
machine the root namespace's view of the management network, every machine's gate address on its own
loopback, connecting over its own cable.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

CLONE_NEWNET = 0x40000000
CONNECT_TIMEOUT_S = 5.0
CHUNK = 1 << 16
READY_TIMEOUT_S = 15.0


def _setns(path: str) -> None:
    with open(path) as handle:
        _setns_fd(handle.fileno(), path)


def _setns_fd(fd: int, what: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), f"setns({what})")


class _Namespaces:
    """The namespace the gate started in and the one it joined, held open: a back route's outgoing socket
    is made in the first (setns there, socket(), setns back; one thread, so nothing else runs between)."""

    def __init__(self, netns: str):
        self.home = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        self.joined = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)

    def join(self) -> None:
        _setns_fd(self.joined, "the joined namespace")

    def home_socket(self) -> socket.socket:
        _setns_fd(self.home, "the first namespace")
        try:
            return socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        finally:
            try:
                _setns_fd(self.joined, "the joined namespace")
            except OSError as exc:  # left in the first namespace, its forward routes would dial from there
                _log(f"cannot return to the joined namespace ({exc}): stopping")
                os._exit(3)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def _listen(address: tuple[str, int], loopback: bool = True) -> socket.socket:
    if loopback and not address[0].startswith("127."):
        raise ValueError(f"{address[0]}: gates listen on loopback addresses only")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
    sock.listen(128)
    sock.setblocking(False)
    return sock


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (OSError, ConnectionError):
        pass


def _log(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)


async def _connect_from(make_socket, target: tuple[str, int]):
    sock = make_socket()
    sock.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(sock, target)
    except BaseException:
        sock.close()
        raise
    return await asyncio.open_connection(sock=sock)


def _handler(target: tuple[str, int], make_socket=None, allow: frozenset[str] | None = None):
    """Serve one route: connect to `target` (from a socket `make_socket` gives, default this namespace's);
    with `allow`, only clients from those addresses."""

    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        if allow is not None:
            peer = (client_writer.get_extra_info("peername") or ("?",))[0]
            if peer not in allow:
                _log(f"{peer} refused: not a control machine")
                client_writer.close()
                return
        try:
            if make_socket is None:
                opened = asyncio.open_connection(*target)
            else:
                opened = _connect_from(make_socket, target)
            reader, writer = await asyncio.wait_for(opened, CONNECT_TIMEOUT_S)
        except (TimeoutError, OSError) as exc:
            _log(f"{target[0]}:{target[1]} unreachable: {exc or 'timeout'}")
            client_writer.close()
            return
        await asyncio.gather(_pipe(client_reader, writer), _pipe(reader, client_writer))
        for end in (writer, client_writer):
            end.close()

    return handle


async def _serve(
    routes: list[tuple[socket.socket, tuple[str, int]]], back=(), make_socket=None, allow=(), open_back=()
) -> None:
    servers = [await asyncio.start_server(_handler(target), sock=sock) for sock, target in routes]
    allowed = frozenset(allow)
    for sock, target in back:
        servers.append(await asyncio.start_server(_handler(target, make_socket, allowed), sock=sock))
    for sock, target in open_back:  # served to every machine of the lab
        servers.append(await asyncio.start_server(_handler(target, make_socket), sock=sock))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for server in servers:
        server.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--netns", required=True, help="the router namespace's file (/run/netns/NAME)")
    parser.add_argument("--log", required=True)
    parser.add_argument("routes", nargs="*", help="LISTEN_ADDRESS:PORT=TARGET_ADDRESS:PORT")
    parser.add_argument("--back", action="append", default=[],
                        help="LISTEN=TARGET: listen in the joined namespace, connect to a loopback TARGET in the first")  # fmt: skip
    parser.add_argument("--allow", action="append", default=[], help="a source address back routes serve")
    parser.add_argument("--open-back", action="append", default=[],
                        help="LISTEN=TARGET: a back route every machine may use (the checkpoint store's S3 API)")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        routes, back, open_back = [], [], []
        for route in args.routes:
            listen, _, target = route.partition("=")
            routes.append((_listen(_address(listen)), _address(target)))
        spaces = _Namespaces(args.netns)
        spaces.join()  # before any thread exists: every thread the loop starts is born in there
        for routes_of, given in ((back, args.back), (open_back, args.open_back)):
            for route in given:
                listen, _, target = route.partition("=")
                if not _address(target)[0].startswith("127."):
                    raise ValueError(f"{target}: back routes reach loopback addresses only")
                routes_of.append((_listen(_address(listen), loopback=False), _address(target)))
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", flush=True)
        return 1
    print("ready", flush=True)
    log = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    for fd in (1, 2):
        os.dup2(log, fd)
    asyncio.run(_serve(routes, back, spaces.home_socket, args.allow, open_back))
    return 0


def start(
    netns: str,
    log: Path,
    routes: dict[str, str],
    back: dict[str, str] | None = None,
    allow: tuple[str, ...] = (),
    open_back: dict[str, str] | None = None,
) -> int:
    """Start a gate for `routes` ({"127.77.1.1:22": "10.77.1.11:22"}), `back` routes served to the
    `allow`ed addresses ({"10.77.0.1:5432": "127.0.0.1:5432"}) and `open_back` routes served to every machine
    (the checkpoint store's S3 API); its PID once it serves."""
    repo = Path(__file__).resolve().parents[2]
    argv = [sys.executable, "-m", "inventory.lab.gate", "--netns", netns, "--log", str(log)]
    argv += [f"{listen}={target}" for listen, target in routes.items()]
    for listen, target in (back or {}).items():
        argv += ["--back", f"{listen}={target}"]
    for address in allow:
        argv += ["--allow", address]
    for listen, target in (open_back or {}).items():
        argv += ["--open-back", f"{listen}={target}"]
    process = subprocess.Popen(
        argv, cwd=repo, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(repo)},
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    line = _read_line(process, READY_TIMEOUT_S)
    process.stdout.close()
    if line.strip() != "ready":
        if process.poll() is None:
            process.kill()
        process.wait()
        raise RuntimeError(f"the lab's gate did not start: {line.strip() or 'it printed nothing'}")
    return process.pid


def _read_line(process: subprocess.Popen, timeout_s: float) -> str:
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout_s):
            return f"no answer in {timeout_s:g} s"
    return process.stdout.readline()


if __name__ == "__main__":
    sys.exit(main())
