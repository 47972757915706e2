"""The Ray nodes of a Volt cluster on its hosts: ports, start, find, stop, readiness and jobs.

Everything goes through a `HostDriver` (local sandbox or SSH) or through the head's HTTP APIs
(state API, job submission); nothing here calls `ray.init()` (DESIGN.md "Processes"). Pure Python.

Port scheme
-----------
Every Ray node gets a *slot*; slot s owns the 50 ports `20000 + 50*s` .. `20000 + 50*s + 49`:

    offset  0   GCS (the head's --port; the cluster address is <head ip>:<this>)
            1   dashboard (HTTP: state API, job submission)
            2   dashboard agent HTTP          3   dashboard agent gRPC
            4   node manager (raylet)         5   object manager
            6   metrics export                7   runtime env agent
            8   Ray client server (head)
            9   the dashboard's own Prometheus endpoint (env DASHBOARD_METRIC_PORT; Ray's default
                44227 would be shared by every head on a machine)
           10   the autoscaler monitor's Prometheus endpoint (env AUTOSCALER_METRIC_PORT, default 44217)
           11   the all-reduce probe's rendezvous (rank 0's TCPStore, on the head's host; `probe_port`)
        12-14   spare
        15-49   worker processes (--min/--max-worker-port): 35 per node

Slots 0..99 span 20000-24999: above Ray's default worker range (10002-19999), clear of Redis 6379,
PostgreSQL 5432, Django 8000, RabbitMQ 25672, MongoDB 27017, Kubernetes NodePorts (30000-32767),
and below the kernel's ephemeral range (32768+), so no outgoing connection is ever handed a port a
node is about to bind. Several Ray components listen on every interface (0.0.0.0), so two nodes on
one machine need distinct slots even with distinct addresses: slots are unique per host, and for
`local` hosts (which share this machine) unique per machine.

GPUs
----
A node advertises its GPUs with `--num-gpus` on every host, CPU-only `local` sandboxes included, and
`gpu_indices` restricts it to the devices placement gave the cluster (CUDA_VISIBLE_DEVICES, which
Ray honours and checks against `--num-gpus`). The same workload code (`num_gpus=1`, Ray Train's
per-worker resources) then schedules identically on local and real clusters, and Ray's GPU counts
are placement's. On a CPU host those GPU ids do not exist, so code that runs on clusters picks its
device with `torch.cuda.is_available()`, never from Ray's GPU resource; the all-reduce probe asks
Ray for no GPU at all (Ray 2.60 leaves CUDA_VISIBLE_DEVICES alone for zero-GPU tasks, so on a GPU
host it still sees the node's devices).

Process bookkeeping
-------------------
A node's files live in its workdir `~/volt/clusters/<cluster_id>/` on the host: `node.json` (what
was started), `node.pid` ("PID PGID" of the detached `ray start --block`), `ray-node.log`. Every
process of the node carries `VOLT_RAY_NODE=<cluster_id>@<host address>` in its environment: Ray
puts its workers and job drivers in process groups of their own, so the recorded group alone does
not find them all, the marker does (`/proc/<pid>/environ`, Linux hosts).

Authentication and environment
------------------------------
With `auth_token`, every node runs Ray's token authentication (`RAY_AUTH_MODE=token`, Ray >= 2.52):
the dashboard (state API, job submission) answers 401/403 without `Authorization: Bearer <token>`, and
the GCS refuses nodes and drivers without it. The token travels as a file (`driver.copy_file`, never
on a command line, which any user of the host may read in /proc) and Ray reads it through
`RAY_AUTH_TOKEN_PATH`. Ray starts under `env -i` with an allowlist: the host session's PATH, HOME,
locale and CUDA library paths, the node's own variables (marker, ports, CUDA_VISIBLE_DEVICES, auth) and
the caller's `env` — nothing else of the session that started it. With `run_as`, Ray runs as that Unix
user (`setpriv`; the caller must be root), in its temp dir, which it owns.
"""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from clusters.provisioning import node_firewall
from clusters.provisioning.ray_http import (  # noqa: F401 - re-exported: callers use ray_nodes.<name>
    JobTimedOut,
    NodesNotReady,
    auth_headers,
    list_nodes,
    submit_job,
    wait_for_nodes,
)
from inventory.drivers.base import CommandResult, DriverError, HostDriver

PORT_BASE = 20000
PORTS_PER_SLOT = 50
MAX_SLOT = 99
_WORKER_PORT_OFFSET = 15
PROBE_PORT_OFFSET = 11

NODE_MARKER_VAR = "VOLT_RAY_NODE"
# What a node keeps of the session that starts it (everything else is dropped by `env -i`). On local
# hosts LD_PRELOAD + VOLT_HOST_ADDRESS are the emulated fabric's source-address shim
# (inventory/drivers/bindsrc.c): without them a local host's connections leave from 127.0.0.1 and its
# links go unshaped. Neither carries a secret.
NODE_ENV_PASSTHROUGH = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "TZ",
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
    "LD_PRELOAD",
    "VOLT_HOST_ADDRESS",
)
AUTH_TOKEN_FILE = "ray-auth-token"  # in the workdir while a start runs; `auth-token` in the temp dir after
_CLUSTER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# AF_UNIX socket paths are limited to 107 bytes; Ray puts its sockets ~64 characters below the temp dir
# (<temp_dir>/session_<date>_<time>_<usec>_<pid>/sockets/plasma_store).
_MAX_TEMP_DIR_CHARS = 40
_START_TIMEOUT_S = 30.0
_KILL_WAIT_S = 5.0
_EARLY_EXIT_CHECK_S = 1


class NodeStartFailed(DriverError):
    """`ray start` could not be launched on a host (the message carries the host's output)."""

    code = "ray_start_failed"


@dataclass(frozen=True)
class NodePorts:
    """Every port one Ray node binds (see the module docstring for the per-slot layout)."""

    gcs: int
    dashboard: int
    dashboard_agent_listen: int
    dashboard_agent_grpc: int
    node_manager: int
    object_manager: int
    metrics_export: int
    runtime_env_agent: int
    client_server: int
    dashboard_metrics: int
    autoscaler_metrics: int
    min_worker: int
    max_worker: int


def probe_port(slot: int) -> int:
    """The port the all-reduce probe's rank 0 serves its rendezvous on, in `slot`'s block (offset 11)."""
    return ports_for(slot).gcs + PROBE_PORT_OFFSET


def ports_for(slot: int) -> NodePorts:
    """The port block of `slot` (0..MAX_SLOT): 50 consecutive ports from 20000 + 50 * slot."""
    if not 0 <= slot <= MAX_SLOT:
        raise ValueError(
            f"slot {slot} is outside 0..{MAX_SLOT} (ports {PORT_BASE}-{PORT_BASE + (MAX_SLOT + 1) * PORTS_PER_SLOT - 1})."
        )
    base = PORT_BASE + PORTS_PER_SLOT * slot
    return NodePorts(
        *(base + offset for offset in range(11)), base + _WORKER_PORT_OFFSET, base + PORTS_PER_SLOT - 1
    )


@dataclass(frozen=True)
class NodeHandle:
    """A started Ray node: where it runs, its detached process (group), ports and workdir on the host."""

    host_address: str
    pid: int
    pgid: int
    ports: NodePorts
    workdir: str
    is_head: bool

    @property
    def gcs_address(self) -> str:
        """The cluster address workers join (meaningful for the head)."""
        return f"{self.host_address}:{self.ports.gcs}"

    @property
    def dashboard_url(self) -> str:
        """The head's HTTP endpoint for the state API and job submission (meaningful for the head)."""
        return f"http://{self.host_address}:{self.ports.dashboard}"


def workdir_for(cluster_id: str) -> str:
    """The node's folder on a host, relative to the host user's home."""
    _check_cluster_id(cluster_id)
    return f"volt/clusters/{cluster_id}"


def host_resource_name(host_id: str | int) -> str:
    """The custom resource (1 per node) that pins tasks to one host: `volt_host_<host_id>`."""
    return "volt_host_" + re.sub(r"[^A-Za-z0-9_]", "_", str(host_id))


def start_head(
    driver: HostDriver,
    *,
    cluster_id: str,
    ports: NodePorts,
    resources: Mapping[str, float] | None = None,
    num_gpus: int = 0,
    temp_dir: str,
    python: str | None = None,
    **options: Any,
) -> NodeHandle:
    """Start the head node of `cluster_id` on this host, or return it if it already runs; returns at once.

    Idempotent: a node of this cluster already running here is returned as it is (NodeStartFailed if
    it is not the one asked for: other role or ports). A `ray start` that exits at once (bad
    interpreter, bad flag) raises NodeStartFailed with its output; one that keeps running but never
    joins (wrong head address, port taken) shows in `wait_for_nodes` and `read_node_log`.

    Optional keywords (same for workers): `num_cpus` (2), `host_id` (names the per-host resource;
    default the node IP), `gpu_indices` (the host GPUs given to this cluster), `object_store_bytes`,
    `env` (extra environment for the node), `node_ip` (the address Ray binds and advertises; default
    the driver's address, which must then be an IP), `auth_token` (the cluster's Ray token: token
    authentication on), `run_as` (a Unix user to run Ray as; the driver's user must be root), `open_workdir`
    (the workdir searchable by others: run_as reaches the storage link in it). The node is up when
    `wait_for_nodes(handle.dashboard_url, 1, ...)` says so (~6-11 s here).
    """
    return _start_node(driver, cluster_id, ports, None, resources, num_gpus, temp_dir, python, **options)


def start_worker(
    driver: HostDriver,
    *,
    cluster_id: str,
    head_address: str,
    ports: NodePorts,
    resources: Mapping[str, float] | None = None,
    num_gpus: int = 0,
    temp_dir: str,
    python: str | None = None,
    **options: Any,
) -> NodeHandle:
    """Start (or find already running) a worker node joining `head_address` (`ip:gcs_port`); see start_head."""
    return _start_node(
        driver, cluster_id, ports, head_address, resources, num_gpus, temp_dir, python, **options
    )


def _start_node(
    driver: HostDriver,
    cluster_id: str,
    ports: NodePorts,
    head_address: str | None,
    resources: Mapping[str, float] | None,
    num_gpus: int,
    temp_dir: str,
    python: str | None,
    *,
    num_cpus: int = 2,
    host_id: str | int | None = None,
    gpu_indices: Sequence[int] | None = None,
    object_store_bytes: int | None = None,
    env: Mapping[str, str] | None = None,
    node_ip: str | None = None,
    auth_token: str | None = None,
    run_as: str | None = None,
    hidden_paths: Sequence[str] = (),
    hostname: str | None = None,
    open_workdir: bool = False,
) -> NodeHandle:
    _check_temp_dir(temp_dir)
    if run_as is not None and not re.match(r"^[a-z_][a-z0-9_-]{0,31}$", run_as):
        raise ValueError(f"run_as {run_as!r} is not a Unix user name.")
    if gpu_indices is not None and len(gpu_indices) != num_gpus:
        raise ValueError(f"num_gpus={num_gpus} but gpu_indices={list(gpu_indices)}: give one index per GPU.")
    node_ip = _checked_ip(node_ip) if node_ip else _ip_of(driver)
    node_resources = {host_resource_name(host_id if host_id is not None else node_ip): 1, **(resources or {})}
    command = [
        *((shlex.quote(python), "-m", "ray.scripts.scripts") if python else ("ray",)),
        "start", "--block", *_role_flags(head_address, node_ip, ports),
        f"--node-ip-address={node_ip}",
        f"--node-manager-port={ports.node_manager}",
        f"--object-manager-port={ports.object_manager}",
        f"--metrics-export-port={ports.metrics_export}",
        f"--dashboard-agent-listen-port={ports.dashboard_agent_listen}",
        f"--dashboard-agent-grpc-port={ports.dashboard_agent_grpc}",
        f"--runtime-env-agent-port={ports.runtime_env_agent}",
        f"--min-worker-port={ports.min_worker}",
        f"--max-worker-port={ports.max_worker}",
        f"--temp-dir={temp_dir}",
        f"--num-cpus={num_cpus}",
        f"--num-gpus={num_gpus}",
        shlex.quote("--resources=" + json.dumps(node_resources, sort_keys=True)),
        "--disable-usage-stats", "--log-style=record", "--log-color=false",
        *([f"--object-store-memory={object_store_bytes}"] if object_store_bytes is not None else []),
    ]  # fmt: skip
    node_env = {
        NODE_MARKER_VAR: node_marker(cluster_id, driver),
        "RAY_USAGE_STATS_ENABLED": "0",
        "DASHBOARD_METRIC_PORT": str(ports.dashboard_metrics),
        "AUTOSCALER_METRIC_PORT": str(ports.autoscaler_metrics),
        **({"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpu_indices))} if gpu_indices is not None else {}),
        **(_auth_env(temp_dir) if auth_token else {}),
        **({"USER": run_as, "LOGNAME": run_as} if run_as else {}),
        **(env or {}),
    }
    if auth_token:
        _send_token(driver, cluster_id, auth_token)
    meta = {"host_address": node_ip, "is_head": head_address is None, "ports": asdict(ports),
            "temp_dir": temp_dir, "marker": node_env[NODE_MARKER_VAR]}  # fmt: skip
    script = "\n".join(
        [
            *(_find_token_lines(cluster_id) if auth_token else []),
            "set +m",  # no job control: the background job is no group leader, so setsid makes it one in place
            _list_function(cluster_id, driver),
            _cd_workdir(cluster_id, create=True),
            # The storage link in here is how `run_as` reaches its storage on an SSH host (search only; the token
            # waits here at mode 0600).
            *(["chmod 711 ."] if run_as and open_workdir else []),
            # One start at a time per node; the lock is released when this script exits (fd 9 is not inherited).
            "exec 9> node.lock",
            "flock -w 20 9 || { echo 'another start of this node holds node.lock' >&2; exit 4; }",
            f"if [ -f node.pid ]; then read pid _g < node.pid; {_is_ours(cluster_id, driver)}"
            " && { echo VOLT_RUNNING; exit 0; }; fi",
            # Leftovers of a node whose `ray start` died would hold its ports: kill them first.
            'left=$(volt_node_pids); if [ -n "$left" ]; then kill -KILL $left 2>/dev/null; sleep 1; fi',
            "rm -f node.pid",
            f"printf '%s\\n' {shlex.quote(json.dumps(meta))} > node.json",
            *_temp_dir_lines(temp_dir, run_as, auth_token is not None),
            f"setsid nohup {launcher(temp_dir, run_as, node_env, python, hidden_paths, hostname)} {' '.join(command)} "
            "> ray-node.log 2>&1 < /dev/null 9>&- &",
            "pid=$!",
            'echo "$pid $pid" > node.pid',  # setsid made it the leader of its own session and group
            # A bad interpreter or flag fails at once; ours until this script exits, so a zombie if so.
            f"sleep {_EARLY_EXIT_CHECK_S}",
            's=$(ps -o stat= -p "$pid"); if [ -z "$s" ] || [ "${s#Z}" != "$s" ]; then',
            "  echo 'ray start exited at once:' >&2; tail -n 20 ray-node.log >&2; rm -f node.pid; exit 3",
            "fi",
            'echo "VOLT_NODE $pid $(pwd -P)"',
        ]
    )
    result = driver.run(script, timeout=_START_TIMEOUT_S + 20)
    if result.ok and result.stdout.strip() == "VOLT_RUNNING":
        return _running_node(driver, cluster_id, ports, head_address is None)
    match = re.search(r"^VOLT_NODE (\d+) (\S+)$", result.stdout, re.MULTILINE)
    if not result.ok or match is None:
        raise NodeStartFailed(f"could not start Ray on {driver.address}: {_output(result)}")
    pid = int(match.group(1))
    return NodeHandle(node_ip, pid, pid, ports, match.group(2), head_address is None)


def _auth_env(temp_dir: str) -> dict[str, str]:
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": f"{temp_dir}/auth-token"}


def _send_token(driver: HostDriver, cluster_id: str, token: str) -> None:
    """Put the token in the (private) workdir as a file; the start script moves it into the temp dir.

    A relative copy lands under the home SFTP starts in, the user's passwd home, which a session's
    HOME may differ from: the workdir is made private in both, and the start script looks in both.
    """
    workdir = workdir_for(cluster_id)
    with tempfile.NamedTemporaryFile("w", prefix="volt-ray-token-") as handle:  # created 0600
        handle.write(token)
        handle.flush()
        for homes in ('"$HOME"', _HOMES):  # the passwd home only when the copy did not land under $HOME
            script = f'for h in {homes}; do [ -n "$h" ] && mkdir -p "$h/{workdir}" && chmod 700 "$h/{workdir}"; done'
            result = driver.run(script, timeout=20)
            if not result.ok:
                raise NodeStartFailed(
                    f"could not create the node's workdir on {driver.address}: {_output(result)}"
                )
            try:
                driver.copy_file(handle.name, f"{workdir}/{AUTH_TOKEN_FILE}")
                return
            except DriverError:
                if homes == _HOMES:
                    raise


_HOMES = '"$HOME" "$(getent passwd "$(id -u)" | cut -d: -f6)"'


def _find_token_lines(cluster_id: str) -> list[str]:
    """Shell: `$tok` is the copied token file; it is removed when the start script exits, whatever happens."""
    path = f"{workdir_for(cluster_id)}/{AUTH_TOKEN_FILE}"
    return [
        f'tok=""; for h in {_HOMES}; do [ -f "$h/{path}" ] && {{ tok="$h/{path}"; break; }}; done',
        'trap \'[ -n "$tok" ] && rm -f "$tok"\' EXIT',
        "[ -n \"$tok\" ] || { echo 'the Ray token of the cluster did not arrive on this host' >&2; exit 5; }",
    ]


def _temp_dir_lines(temp_dir: str, run_as: str | None, with_token: bool) -> list[str]:
    """The node's temp dir, owned by the user Ray runs as, with the token in it readable by that user only."""
    quoted = shlex.quote(temp_dir)
    parent = shlex.quote(temp_dir.rsplit("/", 1)[0] or "/")
    lines = [f"mkdir -p {quoted}"]
    if run_as:
        # The folder is handed to the cluster's user, and root writes the token into it: neither it nor its
        # parent may be a link or another user's (a job of another cluster planting one for a later node).
        lines.append(
            f'if [ -L {quoted} ] || [ "$(stat -c %u {parent})" != "$(id -u)" ]; then '
            "echo 'the node temp dir is a link or its parent is not ours: refusing it' >&2; exit 5; fi"
        )
        lines.append(f"chown -R {run_as}:{run_as} {quoted}")
    if with_token:
        owner = f"-o {run_as} -g {run_as} " if run_as else ""
        lines.append(
            f'install -m 600 {owner}"$tok" {quoted}/auth-token '
            "|| { echo 'could not install the Ray token' >&2; exit 5; }"
        )
    return lines


def launcher(
    temp_dir: str,
    run_as: str | None,
    node_env: Mapping[str, str],
    python: str | None = None,
    hidden_paths: Sequence[str] = (),
    hostname: str | None = None,
) -> str:
    """`[unshare ...] [setpriv ...] env -i -C <temp dir> <allowlist> <node env>`: what precedes `ray start`.

    With an absolute `python`, its folder comes first on the node's PATH: a job's `python ...` entrypoint
    runs the node's own runtime (the Ray and torch the cluster runs), not whatever else is on PATH. With
    `run_as` (so root), `hidden_paths` are covered by an empty tmpfs in the node's own mount namespace
    (node_firewall.hide_prefix: the Unix sockets of Volt's services), and with `hostname` the node gets a
    host name of its own (a local host's address: gloo binds to it)."""
    switch = f"setpriv --reuid={run_as} --regid={run_as} --clear-groups -- " if run_as else ""
    if run_as:
        switch = node_firewall.hide_prefix(hidden_paths, hostname) + switch
    folder = python.rsplit("/", 1)[0] if python and python.startswith("/") else ""
    first = f"{folder}:" if re.match(r"^/[A-Za-z0-9_./+-]*$", folder) else ""
    passthrough = " ".join(
        f'"PATH={first}$PATH"' if name == "PATH" and first else f'${{{name}+"{name}=${name}"}}'
        for name in NODE_ENV_PASSTHROUGH
    )
    own = " ".join(shlex.quote(f"{key}={value}") for key, value in node_env.items())
    return f"{switch}env -i -C {shlex.quote(temp_dir)} {passthrough} {own}"


def _running_node(driver: HostDriver, cluster_id: str, ports: NodePorts, is_head: bool) -> NodeHandle:
    """The node already running for this cluster here, if it is the one asked for."""
    existing = find_node(driver, cluster_id)
    if existing is None:  # it exited between the two calls
        raise NodeStartFailed(f"the Ray node of {cluster_id} on {driver.address} exited while being started.")
    if existing.ports != ports or existing.is_head != is_head:
        role = "head" if existing.is_head else "worker"
        raise NodeStartFailed(
            f"a {role} node of {cluster_id} already runs on {driver.address} with GCS/dashboard ports "
            f"{existing.ports.gcs}/{existing.ports.dashboard}; stop it before starting a different one."
        )
    return existing


def _role_flags(head_address: str | None, node_ip: str, ports: NodePorts) -> list[str]:
    if head_address is not None:
        return [f"--address={head_address}"]
    return [
        "--head",
        f"--port={ports.gcs}",
        "--include-dashboard=true",
        f"--dashboard-host={node_ip}",
        f"--dashboard-port={ports.dashboard}",
        f"--ray-client-server-port={ports.client_server}",
    ]


def _checked_ip(node_ip: str) -> str:
    """Ray binds and advertises an address, never a name (a DNS-named host needs a private address)."""
    try:
        return str(ipaddress.ip_address(node_ip))
    except ValueError:
        raise ValueError(
            f"node_ip {node_ip!r} is not an IP address: Ray binds and advertises addresses; give the host's "
            "private address (the one its provider's other hosts reach it at)."
        ) from None


def _ip_of(driver: HostDriver) -> str:
    for candidate in (driver.address, getattr(driver, "host", None)):
        try:
            return str(ipaddress.ip_address(candidate))
        except (TypeError, ValueError):
            continue
    raise ValueError(
        f"{driver.address} has no IP address to give Ray; pass node_ip= (the address peers reach)."
    )


def find_node(driver: HostDriver, cluster_id: str) -> NodeHandle | None:
    """The running node of `cluster_id` on this host, or None (no pid file, or its process is gone)."""
    script = "\n".join(
        [
            _cd_workdir(cluster_id) + " 2>/dev/null || exit 0",
            "[ -f node.pid ] && [ -f node.json ] || exit 0",
            "read pid pgid < node.pid",
            f"{_is_ours(cluster_id, driver)} || exit 0",
            'echo "VOLT_NODE $pid $pgid $(pwd -P)"',
            "cat node.json",
        ]
    )
    result = driver.run(script, timeout=_START_TIMEOUT_S)
    match = re.search(r"^VOLT_NODE (\d+) (\d+) (\S+)\n(.*)$", result.stdout, re.MULTILINE | re.DOTALL)
    if match is None:
        return None
    meta = json.loads(match.group(4))
    return NodeHandle(
        meta["host_address"], int(match.group(1)), int(match.group(2)), NodePorts(**meta["ports"]),
        match.group(3), meta["is_head"],
    )  # fmt: skip


def node_processes(driver: HostDriver, cluster_id: str) -> list[int]:
    """PIDs of every live (non-zombie) process of `cluster_id`'s node on this host; [] when none."""
    script = "\n".join([_list_function(cluster_id, driver), "volt_node_pids"])
    result = driver.run(script, timeout=_START_TIMEOUT_S)
    if not result.ok:
        raise DriverError(f"could not list the Ray processes on {driver.address}: {_output(result)}")
    return sorted(int(word) for word in result.stdout.split() if word.isdigit())


def stop_node(driver: HostDriver, node: NodeHandle | str, grace_s: float = 3.0) -> list[int]:
    """Stop one node: SIGTERM its process group, SIGKILL everything of the node after `grace_s`.

    `node` is a handle, its workdir or the cluster id. A head drains for ~30 s on SIGTERM, so the
    grace stays short (a worker is gone in under a second). Idempotent; touches only this node's
    processes. Returns the PIDs still alive afterwards (normally []).
    """
    cluster_id = _cluster_id_of(node)
    script = "\n".join(
        [
            _list_function(cluster_id, driver),
            "now_ms() { echo $(( $(date +%s%N) / 1000000 )); }",
            # wait_gone MS: poll until no process of the node is left or MS milliseconds passed.
            'wait_gone() { end=$(( $(now_ms) + $1 )); while [ -n "$(volt_node_pids)" ]; do '
            '[ "$(now_ms)" -ge "$end" ] && return 1; sleep 0.2; done; }',
            _cd_workdir(cluster_id) + " 2>/dev/null || true",
            'pgid=""; [ -f node.pid ] && read _pid pgid < node.pid',
            '[ -n "$pgid" ] && kill -TERM -- "-$pgid" 2>/dev/null',
            f"if ! wait_gone {int(grace_s * 1000)}; then",
            '  [ -n "$pgid" ] && kill -KILL -- "-$pgid" 2>/dev/null',
            "  kill -KILL $(volt_node_pids) 2>/dev/null",
            f"  wait_gone {int(_KILL_WAIT_S * 1000)}",
            "fi",
            'left=$(volt_node_pids | tr "\\n" " ")',
            '[ -z "$left" ] && rm -f node.pid',
            'echo "LEFT $left"',
        ]
    )
    result = driver.run(script, timeout=grace_s + _KILL_WAIT_S + 20)
    match = re.search(r"^LEFT (.*)$", result.stdout, re.MULTILINE)
    if match is None:
        raise DriverError(
            f"could not stop the Ray node of {cluster_id} on {driver.address}: {_output(result)}"
        )
    return [int(word) for word in match.group(1).split()]


JOB_MARKER_VAR = "VOLT_JOB_MARKER"


def job_processes(driver: HostDriver, cluster_id: str, job_marker: str, *, kill: bool = False) -> list[int]:
    """PIDs of the live processes of one job on this host's node of `cluster_id`: those carrying both the
    node's marker and `VOLT_JOB_MARKER=<job_marker>` (Volt sets it in the job's runtime_env, so the job's
    driver and every Ray worker of the job have it). `kill=True` SIGKILLs them first and answers what is
    left. Several local hosts share one /proc: the node marker keeps each host's answer its own."""
    if not re.match(r"^[\w.@/-]{1,200}$", job_marker):
        raise ValueError(f"job marker {job_marker!r} has characters a marker never has.")
    node = shlex.quote(f"{NODE_MARKER_VAR}={node_marker(cluster_id, driver)}")
    job = shlex.quote(f"{JOB_MARKER_VAR}={job_marker}")
    script = "\n".join(
        [
            "volt_job_pids() {",
            f"  for f in $(grep -lzxF {job} /proc/[0-9]*/environ 2>/dev/null); do",
            f'    grep -qzxF {node} "$f" 2>/dev/null || continue',
            '    p=${f#/proc/}; p=${p%/environ}; s=$(ps -o stat= -p "$p" 2>/dev/null)',
            '    [ -n "$s" ] && [ "${s#Z}" = "$s" ] && echo "$p"',
            "  done",
            "}",
            *(['k=$(volt_job_pids); [ -n "$k" ] && kill -KILL $k 2>/dev/null && sleep 0.5'] if kill else []),
            'echo "JOB_PIDS $(volt_job_pids | tr "\\n" " ")"',
        ]
    )
    result = driver.run(script, timeout=_START_TIMEOUT_S)
    match = re.search(r"^JOB_PIDS (.*)$", result.stdout, re.MULTILINE)
    if match is None:
        raise DriverError(f"could not list the job's processes on {driver.address}: {_output(result)}")
    return sorted(int(word) for word in match.group(1).split() if word.isdigit())


def read_node_log(driver: HostDriver, node: NodeHandle | str, lines: int = 40) -> str:
    """The last `lines` of the node's `ray start` output (for error messages)."""
    result = driver.run(
        f"{_cd_workdir(_cluster_id_of(node))} && tail -n {int(lines)} ray-node.log", timeout=10
    )
    return result.stdout if result.ok else ""


def _list_function(cluster_id: str, driver: HostDriver) -> str:
    """Shell function `volt_node_pids`: the node's live processes, its recorded group plus every marked one.

    Zombies are left out: they are dead already and their parent (or init) reaps them.
    """
    marker = shlex.quote(f"{NODE_MARKER_VAR}={node_marker(cluster_id, driver)}")
    pid_file = f"{_workdir_expr(cluster_id)}/node.pid"
    return (
        "volt_node_pids() {\n"
        f'  g=""; [ -f {pid_file} ] && read _p g < {pid_file}\n'
        f"  m=\" $(grep -lzxF {marker} /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 | tr '\\n' ' ')\"\n"
        '  ps -eo pid=,pgid=,stat= | awk -v g="$g" -v m="$m" '
        '\'$3 !~ /^Z/ && ($2 == g || index(m, " " $1 " ")) {print $1}\'\n'
        "}"
    )


def _is_ours(cluster_id: str, driver: HostDriver) -> str:
    """Shell test: process $pid is alive and this node's (a recycled PID would not carry the marker)."""
    marker = shlex.quote(f"{NODE_MARKER_VAR}={node_marker(cluster_id, driver)}")
    return f'grep -qzxF {marker} "/proc/$pid/environ" 2>/dev/null'


def node_marker(cluster_id: str, driver: HostDriver) -> str:
    """The value of NODE_MARKER_VAR for the node of `cluster_id` on this host: whatever carries it in its
    environment (Ray's processes, a job's, the probe's ranks) is stopped with the node."""
    return f"{cluster_id}@{driver.address}"


def _workdir_expr(cluster_id: str) -> str:
    return f'"$HOME/{workdir_for(cluster_id)}"'


def _cd_workdir(cluster_id: str, create: bool = False) -> str:
    path = _workdir_expr(cluster_id)
    return f"mkdir -p {path} && cd {path}" if create else f"cd {path}"


def _cluster_id_of(node: NodeHandle | str) -> str:
    """A handle, a workdir path (its last part is the cluster id) or a bare cluster id."""
    path = node.workdir if isinstance(node, NodeHandle) else node
    cluster_id = path.rstrip("/").rsplit("/", 1)[-1]
    _check_cluster_id(cluster_id)
    return cluster_id


def _check_cluster_id(cluster_id: str) -> None:
    if not _CLUSTER_ID.match(cluster_id):
        raise ValueError(f"cluster id {cluster_id!r}: use letters, digits, '_', '.', '-' (at most 64).")


def _check_temp_dir(temp_dir: str) -> None:
    if (
        not temp_dir.startswith("/")
        or len(temp_dir) > _MAX_TEMP_DIR_CHARS
        or not re.match(r"^[\w/.-]+$", temp_dir)
    ):
        raise ValueError(
            f"temp_dir {temp_dir!r}: give an absolute path of at most {_MAX_TEMP_DIR_CHARS} plain characters "
            "(Ray's socket paths below it must fit in 107 bytes), e.g. /tmp/volt-ray/<cluster>-<slot>."
        )


def _output(result: CommandResult) -> str:
    text = (result.stderr.strip() or result.stdout.strip())[-2000:]
    return f"exit {result.exit_status}: {text or '(no output)'}"
