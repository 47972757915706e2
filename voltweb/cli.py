"""`volt`: a command-line client over the REST API, for CI pipelines (docs/cli.md).

Standard library only and no Django import, so the file runs wherever Python 3.11 does, even copied on
its own (`python3 cli.py clusters list`). JSON goes to stdout, progress and errors to stderr, and the
exit code says how it ended: 0 ok, 1 usage/HTTP/network error, 2 cluster failed, 3 cluster terminated,
4 timed out waiting.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

__version__ = "0.1.0"

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_WAIT_TIMEOUT_S = 1800
DEFAULT_POLL_INTERVAL_S = 2.0
HTTP_TIMEOUT_S = 30
LIST_PAGE_SIZE = 500
LOG_PAGE = 256 * 1024  # characters one /logs/ answer carries at most (the server's LOG_PAGE_MAX)

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_FAILED = 2
EXIT_TERMINATED = 3
EXIT_TIMEOUT = 4
EXIT_INTERRUPTED = 130

# The API's cluster statuses (clusters.choices.ClusterStatus; a test keeps the two equal). Copied
# because this client must not import Django.
STATUSES = (
    "pending",
    "placing",
    "queued",
    "provisioning",
    "verifying",
    "ready",
    "degraded",
    "recovering",
    "terminating",
    "terminated",
    "failed",
)
# The bring-up path in order: waiting for one of these is also satisfied by any later one, so a poll
# that missed `provisioning` because the cluster was already `ready` still ends the wait.
BRING_UP = ("pending", "placing", "queued", "provisioning", "verifying", "ready")
ENDING = ("terminating", "terminated")
# Besides no answer at all, the answers worth polling through while waiting (a deploy, a proxy hiccup, a
# database failover); GETs are safe to repeat. Any other error ends the wait at once.
RETRY_HTTP = {429, 500, 502, 503, 504}


class CliError(Exception):
    """Ends the command: `message` on stderr, `exit_code` as the process status."""

    def __init__(self, message: str, exit_code: int = EXIT_ERROR):
        super().__init__(message)
        self.exit_code = exit_code


class UsageError(CliError):
    """The command line itself is wrong."""


class Unreachable(CliError):
    """No HTTP answer at all: DNS, refused connection, TLS, timeout."""


class ApiError(CliError):
    """The API answered with an error: its status, code, message and per-field messages."""

    def __init__(self, status: int, code: str, message: str, fields: dict | None = None):
        self.status, self.code, self.fields = status, code, fields or {}
        super().__init__(self._describe(message))

    def _describe(self, message: str) -> str:
        text = f"{self.status} {self.code}: {message}"
        # The API's message names the first field; list the others so one run shows every problem.
        for field, problems in list(self.fields.items())[1:]:
            text += (
                f"\n  {field}: {'; '.join(map(str, problems if isinstance(problems, list) else [problems]))}"
            )
        if self.status == 401:
            text += "\n  check VOLT_TOKEN: the token may be mistyped, expired or revoked"
        return text


# --- HTTP -----------------------------------------------------------------------------------------


class Client:
    """JSON over HTTP to /api/v1/ with a bearer token."""

    def __init__(self, base_url: str, token: str, http_timeout_s: float = HTTP_TIMEOUT_S):
        self.base_url = base_url
        self.api_root = base_url + "/api/v1"
        self.token = token
        self.http_timeout_s = http_timeout_s

    def get(self, path: str, params: dict | None = None) -> Any:
        query = urllib.parse.urlencode({k: v for k, v in (params or {}).items() if v is not None})
        return self.request("GET", self.api_root + path + (f"?{query}" if query else ""))

    def post(self, path: str, body: dict | None = None) -> Any:
        return self.request("POST", self.api_root + path, body)

    def get_csv(self, path: str, params: dict | None = None) -> str:
        """A CSV export (`format=csv`), as text."""
        query = urllib.parse.urlencode(
            {k: v for k, v in {**(params or {}), "format": "csv"}.items() if v is not None}
        )
        return self.request("GET", f"{self.api_root}{path}?{query}", accept="text/csv")

    def post_multipart(self, path: str, fields: dict, files: dict[str, tuple[str, bytes]]) -> Any:
        """A multipart/form-data POST (a job's working dir archive): `files` maps a field to (name, bytes)."""
        boundary = f"volt-{os.urandom(12).hex()}"
        parts = []
        for name, value in fields.items():
            parts.append(
                f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
            )
        for name, (filename, content) in files.items():
            head = (f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
                    "Content-Type: application/gzip\r\n\r\n")  # fmt: skip
            parts.append(head.encode() + content + b"\r\n")
        body = b"".join(parts) + f"--{boundary}--\r\n".encode()
        return self.request(
            "POST", self.api_root + path, raw=(body, f"multipart/form-data; boundary={boundary}")
        )

    def all_pages(self, path: str, params: dict | None = None) -> list:
        """Every result of a paginated collection, following `next` links."""
        page = self.get(path, params)
        results = list(page["results"])
        while page.get("next"):
            page = self.request("GET", page["next"])
            results += page["results"]
        return results

    def request(
        self,
        method: str,
        url: str,
        body: dict | None = None,
        raw: tuple[bytes, str] | None = None,
        accept: str = "application/json",
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = self._headers(data)
        headers["Accept"] = accept
        if raw is not None:
            data, headers["Content-Type"] = raw
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.http_timeout_s) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            raise _api_error(exc) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise Unreachable(f"cannot reach Volt at {self.base_url}: {reason}") from None
        if accept != "application/json":
            return payload.decode()
        try:
            return json.loads(payload)
        except ValueError:
            raise CliError(f"{url} did not answer JSON; is {self.base_url} a Volt server?") from None

    def _headers(self, data: bytes | None) -> dict[str, str]:
        headers = {
            "Authorization": f"Bearer {self.token}",
            "Accept": "application/json",
            "User-Agent": f"volt-cli/{__version__}",
        }
        if data is not None:
            headers["Content-Type"] = "application/json"
        return headers


def _api_error(exc: urllib.error.HTTPError) -> ApiError:
    try:
        raw = exc.read()
    except OSError:
        raw = b""
    try:
        error = json.loads(raw)["error"]
        return ApiError(exc.code, error.get("code", "error"), error.get("message", ""), error.get("fields"))
    except (ValueError, KeyError, TypeError, AttributeError):
        text = raw.decode("utf-8", "replace").strip()[:200]
        return ApiError(exc.code, str(exc.reason or "error").lower().replace(" ", "_"), text or "no details")


# --- waiting --------------------------------------------------------------------------------------


def reached(status: str, targets: Sequence[str]) -> bool:
    """True if `status` is a target, or further along the bring-up path than a target is."""
    if status in targets:
        return True
    if status not in BRING_UP:
        return False
    return any(t in BRING_UP and BRING_UP.index(status) > BRING_UP.index(t) for t in targets)


def outcome(status: str, targets: Sequence[str]) -> int | None:
    """The exit code the wait ends with at `status`, or None to keep waiting."""
    if reached(status, targets):
        return EXIT_OK
    if status == "failed":
        return EXIT_FAILED
    if status in ENDING and not set(ENDING) & set(targets):
        return EXIT_TERMINATED
    return None


def wait(client: Client, cluster: dict, targets: Sequence[str], timeout_s: float) -> int:
    """Poll the cluster until a target status, failure, termination or the timeout; print it last seen."""
    started = time.monotonic()
    deadline = started + timeout_s
    interval = _poll_interval()
    shown = None
    while True:
        if cluster["status"] != shown:
            _progress(f"{_label(cluster)}: {_status_line(cluster)} [{time.monotonic() - started:.0f}s]")
            shown = cluster["status"]
        code = outcome(cluster["status"], targets)
        if code is None and time.monotonic() >= deadline:
            code = EXIT_TIMEOUT
        if code is not None:
            _emit(cluster)
            _say_how_it_ended(cluster, code, targets, timeout_s)
            return code
        time.sleep(max(0.0, min(interval, deadline - time.monotonic())))
        cluster = _poll(client, cluster["id"], deadline, interval)


def _poll(client: Client, cluster_id: int, deadline: float, interval: float) -> dict:
    """The cluster now; a server restarting mid-wait is retried until the deadline, not fatal."""
    while True:
        try:
            return client.get(f"/clusters/{cluster_id}/")
        except (Unreachable, ApiError) as exc:
            transient = isinstance(exc, Unreachable) or exc.status in RETRY_HTTP
            if not transient or time.monotonic() >= deadline:
                raise
            _progress(f"{exc}; retrying")
            time.sleep(max(0.0, min(interval, deadline - time.monotonic())))


def _say_how_it_ended(cluster: dict, code: int, targets: Sequence[str], timeout_s: float) -> None:
    if code == EXIT_FAILED:
        reason = cluster.get("failure_reason") or "unknown reason"
        _progress(f"{_label(cluster)} failed ({reason}): {cluster.get('failure_message') or 'no details'}")
    elif code == EXIT_TERMINATED:
        _progress(f"{_label(cluster)} was {cluster['status']} before it became {' or '.join(targets)}")
    elif code == EXIT_TIMEOUT:
        _progress(
            f"timed out after {timeout_s:g} s waiting for {' or '.join(targets)}; "
            f"{_label(cluster)} is still {_status_line(cluster)}"
        )


def _status_line(cluster: dict) -> str:
    status = cluster["status"]
    if status == "queued":
        bound = f", starts by {cluster['starts_by']}" if cluster.get("starts_by") else ""
        return (
            f"queued (position {cluster.get('queue_position')}{bound}: "
            f"{cluster.get('queue_reason') or 'no reason'})"
        )
    if status == "failed":
        return f"failed ({cluster.get('failure_reason')})"
    if status in ("provisioning", "verifying", "ready") and cluster.get("price_per_hour"):
        nodes = len(cluster.get("nodes") or [])
        return f"{status} ({nodes} x {cluster.get('gpu_model')}, ${cluster['price_per_hour']}/hour)"
    return status


def _label(cluster: dict) -> str:
    return f"cluster {cluster['id']} ({cluster.get('name')})"


def _poll_interval() -> float:
    raw = os.environ.get("VOLT_POLL_INTERVAL", "")
    try:
        return max(0.1, float(raw)) if raw else DEFAULT_POLL_INTERVAL_S
    except ValueError:
        raise UsageError(f"VOLT_POLL_INTERVAL must be a number of seconds, not {raw!r}") from None


# --- commands -------------------------------------------------------------------------------------


def cmd_create(client: Client, args: argparse.Namespace) -> int:
    cluster = client.post("/clusters/", build_spec(args))
    if not _waits(args):
        _emit(cluster)
        return EXIT_OK
    return wait(client, cluster, args.wait_for or ("ready",), args.timeout)


def cmd_preview(client: Client, args: argparse.Namespace) -> int:
    _emit(client.post("/placements/preview", build_spec(args)))
    return EXIT_OK


def cmd_get(client: Client, args: argparse.Namespace) -> int:
    _emit(_get_cluster(client, args.id))
    return EXIT_OK


def cmd_list(client: Client, args: argparse.Namespace) -> int:
    params = {"status": args.status, "team__slug": args.team}
    if args.all_pages:
        _emit(client.all_pages("/clusters/", params | {"page_size": LIST_PAGE_SIZE}))
    else:
        _emit(client.get("/clusters/", params)["results"])
    return EXIT_OK


def cmd_events(client: Client, args: argparse.Namespace) -> int:
    with _not_found_says_which(args.id):
        _emit(client.all_pages(f"/clusters/{args.id}/events/", {"page_size": LIST_PAGE_SIZE}))
    return EXIT_OK


def cmd_wait(client: Client, args: argparse.Namespace) -> int:
    return wait(client, _get_cluster(client, args.id), args.wait_for or ("ready",), args.timeout)


def cmd_extend(client: Client, args: argparse.Namespace) -> int:
    with _not_found_says_which(args.id):
        _emit(client.post(f"/clusters/{args.id}/extend/", {"seconds": args.by}))
    return EXIT_OK


def cmd_terminate(client: Client, args: argparse.Namespace) -> int:
    try:
        with _not_found_says_which(args.id):
            cluster = client.post(f"/clusters/{args.id}/terminate/")
    except ApiError as exc:
        if not (args.ok_if_ended and exc.code == "illegal_transition"):
            raise
        cluster = _get_cluster(client, args.id)
        _progress(f"{_label(cluster)} had already ended: {cluster['status']}")
        _emit(cluster)
        return EXIT_OK
    if not args.wait:
        _emit(cluster)
        return EXIT_OK
    return wait(client, cluster, ("terminated",), args.timeout)


def _get_cluster(client: Client, cluster_id: int) -> dict:
    with _not_found_says_which(cluster_id):
        return client.get(f"/clusters/{cluster_id}/")


@contextmanager
def _not_found_says_which(cluster_id: int) -> Iterator[None]:
    try:
        yield
    except ApiError as exc:
        if exc.status != 404:
            raise
        message = f"cluster {cluster_id} not found (or it belongs to another team)"
        raise ApiError(404, exc.code, message) from None


def _waits(args: argparse.Namespace) -> bool:
    return bool(args.wait or args.wait_for)


def build_spec(args: argparse.Namespace) -> dict:
    """The API's cluster spec from the create/preview flags; unset flags keep the server's defaults."""
    per_node = {count for _model, count in args.gpu}
    if len(per_node) > 1:
        asked = ", ".join(f"{m}:{c}" for m, c in args.gpu)
        raise UsageError(f"every --gpu must ask the same GPUs per node ({asked})")
    spec: dict[str, Any] = {
        "nodes": args.nodes,
        "gpus_per_node": per_node.pop(),
        "gpu_models": [model for model, _count in args.gpu],
        "model_policy": "ordered" if args.ordered else "any_of",
    }
    optional = {
        "name": args.name,
        "team": args.team,
        "priority": args.priority,
        "regions": args.region,
        "max_price_per_gpu_hour": args.max_price,
        "parallelism": args.parallelism,
        "pipeline_stages": args.pipeline_stages,
    }
    spec |= {key: value for key, value in optional.items() if value is not None}
    if args.duration:
        spec["duration_s"] = args.duration
    if args.no_locality_wait:
        spec["wait_for_locality"] = []
    elif args.wait_for_locality:
        spec["wait_for_locality"] = args.wait_for_locality
    spec |= _constraint("interconnect", args.interconnect, args.require_interconnect)
    spec |= _constraint("topology", args.topology, args.require_topology)
    return spec


def _constraint(name: str, value: Any, required: bool) -> dict:
    """`--interconnect X` prefers X; with `--require-interconnect` it must hold (same for topology)."""
    if value is None:
        if required:
            raise UsageError(f"--require-{name} needs --{name}")
        return {}
    key = "topology_level" if name == "topology" else name
    return {key: value, f"{name}_mode": "required" if required else "preferred"}


# --- command line ---------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """Usage errors exit 1 (argparse's own 2 means "cluster failed" here)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        raise UsageError(f"{message} (see {self.prog} --help)")


def _gpu(value: str) -> tuple[str, int]:
    model, _, count = value.rpartition(":")
    if not model.strip() or not count.isdigit() or int(count) < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not MODEL:COUNT, e.g. H100:8")
    return model.strip(), int(count)


def _statuses(value: str) -> tuple[str, ...]:
    statuses = tuple(s.strip() for s in value.split(",") if s.strip())
    unknown = [s for s in statuses if s not in STATUSES]
    if unknown or not statuses:
        raise argparse.ArgumentTypeError(f"{value!r}: statuses are {', '.join(STATUSES)}")
    return statuses


def _cluster_id(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a cluster id (a positive number)")
    return int(value)


def _line_count(value: str) -> int:
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of lines (0 or more)")
    return int(value)


def _connection_flags() -> argparse.ArgumentParser:
    # SUPPRESS: a flag given after the subcommand must not be reset by the one before it, and vice versa.
    flags = argparse.ArgumentParser(add_help=False)
    flags.add_argument("--url", default=argparse.SUPPRESS, help=f"Volt's address (VOLT_URL; {DEFAULT_URL})")
    flags.add_argument(
        "--token", default=argparse.SUPPRESS, help="API token (VOLT_TOKEN; prefer the variable)"
    )
    return flags


def _spec_flags() -> argparse.ArgumentParser:
    flags = argparse.ArgumentParser(add_help=False)
    add = flags.add_argument
    add("--nodes", type=int, required=True, help="number of hosts")
    add(
        "--gpu",
        type=_gpu,
        action="append",
        required=True,
        metavar="MODEL:COUNT",
        help="GPU model and GPUs per node, e.g. H100:8; repeat for alternatives (same COUNT)",
    )
    add("--ordered", action="store_true", help="with several --gpu: the first that fits, not the best plan")
    add("--name", help="cluster name (a slug)")
    add("--team", help="team slug; optional when you belong to one team")
    add(
        "--interconnect",
        action="append",
        metavar="KIND",
        help="infiniband, roce, ethernet or a fabric kind (ib_ndr, ...); preferred unless required",
    )
    add("--require-interconnect", action="store_true", help="refuse hosts without --interconnect")
    add(
        "--topology", choices=["block", "fabric", "site", "region"], help="keep all nodes within one of these"
    )
    add("--require-topology", action="store_true", help="refuse plans that span more than --topology")
    add("--region", action="append", help="allowed region; repeat for several")
    add("--max-price", metavar="USD", help="highest price per GPU hour")
    add("--parallelism", help="data_parallel, tensor_pipeline, inference_replicas or independent")
    add("--pipeline-stages", type=int, metavar="N")
    add("--priority", type=int, help="-100..100; higher is placed first from the queue")
    add(
        "--duration",
        type=duration_s,
        metavar="DURATION",
        help="how long you need it (4h, 2d): warned before the end, then terminated unless extended",
    )
    waits = flags.add_mutually_exclusive_group()
    waits.add_argument(
        "--wait-for-locality",
        type=locality_wait,
        action="append",
        metavar="LEVEL:DURATION",
        help="wait up to DURATION for one LEVEL before placing wider, e.g. site:30m; repeat per level "
        "(default: collective requests wait the server's VOLT_LOCALITY_WAIT_S for one site)",
    )
    waits.add_argument("--no-locality-wait", action="store_true", help="place as written at once")
    return flags


def _wait_flags(wait: bool = True, targets: bool = True) -> argparse.ArgumentParser:
    flags = argparse.ArgumentParser(add_help=False)
    if wait:
        flags.add_argument(
            "--wait", action="store_true", help="poll until the cluster gets there (exit codes 0/2/3/4)"
        )
    flags.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_WAIT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"give up waiting after this long, exit 4 (default {DEFAULT_WAIT_TIMEOUT_S})",
    )
    if targets:
        flags.add_argument(
            "--wait-for",
            type=_statuses,
            metavar="STATUS[,STATUS]",
            help="wait for these statuses instead of ready, e.g. provisioning (implies --wait)",
        )
    return flags


# --- jobs -----------------------------------------------------------------------------------------

JOB_ENDED = {"succeeded": EXIT_OK, "failed": EXIT_FAILED, "stopped": EXIT_TERMINATED}


def _archive(folder: str) -> bytes:
    """The folder as a .tar.gz in memory (what the API unpacks as the job's working dir)."""
    import io
    import tarfile

    if not os.path.isdir(folder):
        raise UsageError(f"--workdir {folder!r} is not a folder")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for entry in sorted(os.listdir(folder)):
            if entry in ("__pycache__", ".git"):
                continue
            archive.add(os.path.join(folder, entry), arcname=entry,
                        filter=lambda info: None if info.issym() or "__pycache__" in info.name else info)  # fmt: skip
    return buffer.getvalue()


def _env(pairs: Sequence[str] | None) -> dict[str, str]:
    env = {}
    for pair in pairs or ():
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise UsageError(f"--env {pair!r}: write NAME=value")
        env[name] = value
    return env


def cmd_job_submit(client: Client, args: argparse.Namespace) -> int:
    command = list(args.command or [])
    if command[:1] == ["--"]:
        command = command[1:]
    if args.demo == bool(command):
        raise UsageError("give the command to run after -- (e.g. -- python train.py), or --demo")
    body: dict[str, Any] = {"cluster": args.cluster, "env": _env(args.env), "name": args.name or ""}
    if args.checkpoint_every is not None:
        body["checkpoint_every"] = args.checkpoint_every
    if args.demo:
        body.update(demo=True, steps=args.steps, seed=args.seed, step_sleep=args.step_sleep)
    else:
        import shlex

        body["entrypoint"] = shlex.join(command)
    if args.workdir:
        if args.demo:
            raise UsageError("--workdir goes with your own command, not --demo")
        fields = {k: json.dumps(v) if isinstance(v, dict) else v for k, v in body.items()}
        job = client.post_multipart(
            "/jobs/", fields, {"working_dir": ("workdir.tar.gz", _archive(args.workdir))}
        )
    else:
        job = client.post("/jobs/", body)
    _progress(f"job {job['id']} ({job['name']}) submitted to cluster {job['cluster']}")
    if not args.wait:
        _emit(job)
        return EXIT_OK
    return follow_job(client, job["id"], args.timeout, stream=True)


def _log_params(offset: int, limit: int | None = None, *, raw: bool = False) -> dict:
    """A /logs/ query: the readable text (colours stripped, VOLT_EVENT lines as steps, losses and
    checkpoints, whole lines) unless `raw`. Offsets are the stored text's either way."""
    params: dict[str, Any] = {"offset": offset}
    if limit is not None:
        params["limit"] = limit
    if not raw:
        params["readable"] = 1
    return params


def follow_job(
    client: Client, job_id: int, timeout_s: float, *, stream: bool, to_stdout: bool = False, offset: int = 0,
    raw: bool = False,
) -> int:  # fmt: skip
    """Print the job's log from `offset` as it grows (stderr, or stdout for `logs --follow`) until it ends;
    exit by status."""
    deadline = time.monotonic() + timeout_s
    interval = _poll_interval()
    out = sys.stdout if to_stdout else sys.stderr
    while True:
        # Not streaming (stop --wait): only whether the job ended and its log is all stored; no text needed.
        params = _log_params(offset, raw=raw) if stream else {"offset": offset, "limit": 1}
        page = _job_get(client, f"/jobs/{job_id}/logs/", params)
        if stream and page["text"]:
            out.write(page["text"])
            out.flush()
        asked = offset
        offset = page["next_offset"] if stream else max(offset, page["size"])
        if (stream and asked < offset < page["size"]) or (not stream and page["next_offset"] < offset):
            # More stored than one answer carries (streaming; a line still being written waits for the
            # next poll), or not yet asked at the end (not streaming).
            continue
        if page["status"] in JOB_ENDED and page["complete"]:
            job = _job_get(client, f"/jobs/{job_id}/")
            if not to_stdout:
                _emit(job)
            code = JOB_ENDED[job["status"]]
            if code:
                _progress(f"job {job_id} {job['status']}: {job.get('status_reason') or 'no details'}")
            return code
        if time.monotonic() >= deadline:
            _progress(f"timed out after {timeout_s:g} s; job {job_id} is still {page['status']}")
            return EXIT_TIMEOUT
        time.sleep(max(0.0, min(interval, deadline - time.monotonic())))


def _job_get(client: Client, path: str, params: dict | None = None) -> Any:
    try:
        return client.get(path, params)
    except ApiError as exc:
        if exc.status == 404:
            raise ApiError(404, exc.code, "job not found (or it belongs to another team)") from None
        raise


def tail_log(client: Client, job_id: int, lines: int, *, raw: bool = False) -> tuple[str, int]:
    """The last `lines` lines of the job's stored log, and the offset just past them (where a follow goes
    on). Pages are read backwards from the end, only as far as needed."""
    size = end = _job_get(client, f"/jobs/{job_id}/logs/", {"offset": 0, "limit": 1})["size"]
    text, follow_from = "", size
    while end > 0 and text.count("\n") <= lines:  # one newline more than lines: the first is whole
        start = max(0, end - LOG_PAGE)
        page = _job_get(client, f"/jobs/{job_id}/logs/", _log_params(start, end - start, raw=raw))
        if end == size:
            follow_from = page["next_offset"]  # a readable page ends at a whole line
        text = page["text"] + text
        end = page["offset"] if page["offset"] < end else start  # a readable page starts at a whole line
    kept = text.splitlines(keepends=True)[-lines:] if lines else []
    return "".join(kept), follow_from


def cmd_job_logs(client: Client, args: argparse.Namespace) -> int:
    offset = 0
    if args.tail is not None:
        text, offset = tail_log(client, args.id, args.tail, raw=args.raw)
        sys.stdout.write(text)
        sys.stdout.flush()
        if not args.follow:
            return EXIT_OK
    if args.follow:
        return follow_job(
            client, args.id, args.timeout, stream=True, to_stdout=True, offset=offset, raw=args.raw
        )
    while True:
        page = _job_get(client, f"/jobs/{args.id}/logs/", _log_params(offset, raw=args.raw))
        sys.stdout.write(page["text"])
        offset = page["next_offset"]
        if not page["text"] or offset >= page["size"]:
            sys.stdout.flush()
            return EXIT_OK


def cmd_job_stop(client: Client, args: argparse.Namespace) -> int:
    try:
        job = client.post(f"/jobs/{args.id}/stop/")
    except ApiError as exc:
        if exc.status == 404:
            raise ApiError(
                404, exc.code, f"job {args.id} not found (or it belongs to another team)"
            ) from None
        raise
    if not args.wait:
        _emit(job)
        return EXIT_OK
    code = follow_job(client, args.id, args.timeout, stream=False)
    return EXIT_OK if code == EXIT_TERMINATED else code


def cmd_job_list(client: Client, args: argparse.Namespace) -> int:
    _emit(client.get("/jobs/", {"cluster": args.cluster, "status": args.status})["results"])
    return EXIT_OK


def cmd_job_get(client: Client, args: argparse.Namespace) -> int:
    _emit(_job_get(client, f"/jobs/{args.id}/"))
    return EXIT_OK


def _add_job_commands(resources, connection) -> None:
    jobs = resources.add_parser("jobs", help="submit, follow and stop jobs on clusters")
    commands = jobs.add_subparsers(dest="command", required=True)

    def command(name: str, handler, help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help, parents=[connection])
        sub.set_defaults(handler=handler)
        return sub

    timeout = {"type": float, "default": DEFAULT_WAIT_TIMEOUT_S, "metavar": "SECONDS",
               "help": f"give up waiting after this long, exit 4 (default {DEFAULT_WAIT_TIMEOUT_S})"}  # fmt: skip
    submit = command("submit", cmd_job_submit,
                     "submit a job: volt jobs submit --cluster N [--wait] [--workdir DIR] -- python train.py")  # fmt: skip
    submit.add_argument("--cluster", type=_cluster_id, required=True, help="a READY cluster of your team")
    submit.add_argument(
        "--wait", action="store_true", help="print its log until it ends; exit 0 if it succeeded"
    )
    submit.add_argument("--workdir", help="folder shipped with the job (archived; volt_ckpt.py is added)")
    submit.add_argument("--env", action="append", metavar="NAME=VALUE", help="environment variable; repeat")
    submit.add_argument("--name", help="job name")
    submit.add_argument("--checkpoint-every", type=int, metavar="STEPS", help="steps between checkpoints")
    submit.add_argument("--demo", action="store_true", help="run the demo workload instead of a command")
    submit.add_argument("--steps", type=int, default=60, help="--demo: training steps (60)")
    submit.add_argument("--seed", type=int, default=0, help="--demo: seed (0)")
    submit.add_argument("--step-sleep", type=float, default=0.0, help="--demo: seconds per step (0)")
    submit.add_argument("--timeout", **timeout)
    submit.add_argument("command", nargs=argparse.REMAINDER, help="after --: the command to run")
    logs = command("logs", cmd_job_logs, "a job's log; --follow until it ends (exit 0 if it succeeded)")
    logs.add_argument("id", type=_cluster_id)
    logs.add_argument(
        "--raw", action="store_true", help="as stored (colour codes, VOLT_EVENT lines), not as people read it"
    )
    logs.add_argument("--follow", "-f", action="store_true")
    logs.add_argument(
        "--tail", type=_line_count, metavar="LINES", help="only the last LINES lines (then --follow)"
    )
    logs.add_argument("--timeout", **timeout)
    stop = command("stop", cmd_job_stop, "stop a job on every host; --wait until it is stopped")
    stop.add_argument("id", type=_cluster_id)
    stop.add_argument("--wait", action="store_true")
    stop.add_argument("--timeout", **timeout)
    listing = command("list", cmd_job_list, "your teams' jobs, newest first")
    listing.add_argument("--cluster", type=_cluster_id)
    listing.add_argument(
        "--status", choices=["pending", "running", "succeeded", "failed", "stopped", "interrupted"]
    )
    command("get", cmd_job_get, "one job").add_argument("id", type=_cluster_id)


# --- scheduling: --wait-for-locality, `volt goodput` ---------------------------------------------------
CATEGORIES = ("productive", "queued", "provisioning", "verification", "checkpoint_save", "recovery",
              "lost_work", "idle", "teardown")  # fmt: skip


LEVELS = ("block", "fabric", "site", "region")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_s(text: str) -> int:
    """`90s`, `30m`, `4h`, `2d` or plain seconds → seconds (argparse type)."""
    text = text.strip().lower()
    number, unit = (text[:-1], text[-1]) if text and text[-1] in UNITS else (text, "s")
    try:
        value = float(number) * UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: write 90s, 30m, 4h or 2d") from None
    if not 0 < value <= 366 * 86400:  # NaN and inf fail here too
        raise argparse.ArgumentTypeError(f"{text!r}: a duration above 0 and at most 366d")
    return int(round(value))


def locality_wait(text: str) -> dict:
    """`site:30m` → {"level": "site", "max_wait_s": 1800} (argparse type of --wait-for-locality)."""
    level, _, span = text.partition(":")
    if level not in LEVELS or not span:
        raise argparse.ArgumentTypeError(
            f"{text!r}: write LEVEL:DURATION, LEVEL one of {', '.join(LEVELS)} (e.g. site:30m)"
        )
    return {"level": level, "max_wait_s": duration_s(span)}


def _whole_number(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, not {value!r}")
    return int(value)


def add_goodput_command(resources, connection) -> None:
    sub = resources.add_parser(
        "goodput",
        help="where your teams' GPU time went: productive, queued, recovery, lost work, idle ...",
        description="Where your teams' GPU time went, per category, from Volt's recorded timelines.",
        parents=[connection],
    )
    which = sub.add_mutually_exclusive_group()
    which.add_argument("--cluster", type=_whole_number, metavar="ID", help="one cluster's ledger")
    which.add_argument("--job", type=_whole_number, metavar="ID", help="one job's ledger")
    sub.add_argument("--team", help="a team's slug (default: all of yours)")
    sub.add_argument("--since", help="a date (2026-12-01) or ISO time; default 30 days ago")
    sub.add_argument("--until", help="a date or ISO time; default now")
    out = sub.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="the API's JSON")
    out.add_argument("--csv", action="store_true", help="day,team,provider,category,gpu_hours rows")
    sub.set_defaults(handler=cmd_goodput)


def cmd_goodput(client: Client, args: argparse.Namespace) -> int:
    window = {"team": args.team, "since": args.since, "until": args.until}
    if args.cluster or args.job:
        path = f"/goodput/clusters/{args.cluster}/" if args.cluster else f"/jobs/{args.job}/goodput/"
        ledger = client.get(path)
        if args.json or args.csv:
            _emit(ledger)
            return 0
        what = f"cluster {args.cluster}" if args.cluster else f"job {args.job}"
        sys.stdout.write(f"{what}: {ledger['wall_s'] / 3600:.2f} h wall-clock, from {ledger['start']}\n")
        sys.stdout.write(table(ledger["seconds"], ledger["gpu_hours"]))
        return 0
    if args.csv:
        sys.stdout.write(client.get_csv("/goodput/", window))
        return 0
    report = client.get("/goodput/", window)
    if args.json:
        _emit(report)
        return 0
    sys.stdout.write(f"{report['since'][:10]} to {report['until'][:19]}: {report['clusters']} clusters\n")
    for team in report["teams"]:
        sys.stdout.write(f"\nteam {team['team']}\n")
        sys.stdout.write(table(team["totals"]["seconds"], team["totals"]["gpu_hours"]))
    if not report["teams"]:
        sys.stdout.write("no cluster of yours lived in this window\n")
    return 0


def table(seconds: dict[str, float], gpu_hours: dict[str, float]) -> str:
    """category, hours, GPU-hours and share of GPU-hours, the categories with any time."""
    held = sum(gpu_hours.values())
    lines = [f"  {'category':<16}{'hours':>10}{'GPU-hours':>12}{'share':>8}"]
    for key in CATEGORIES:
        if not seconds.get(key) and not gpu_hours.get(key):
            continue
        share = 100.0 * gpu_hours.get(key, 0) / held if held else 0.0
        lines.append(
            f"  {key:<16}{seconds.get(key, 0) / 3600:>10.2f}{gpu_hours.get(key, 0):>12.2f}{share:>7.1f}%"
        )
    lines.append(f"  {'total':<16}{sum(seconds.values()) / 3600:>10.2f}{held:>12.2f}")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    connection = _connection_flags()
    parser = _Parser(
        prog="volt",
        description="Volt GPU clusters from the command line (docs/cli.md).",
        parents=[connection],
    )
    parser.add_argument("--version", action="version", version=f"volt {__version__}")
    resources = parser.add_subparsers(dest="resource", required=True, metavar="clusters|jobs|goodput")
    clusters = resources.add_parser("clusters", help="request, inspect and terminate clusters")
    commands = clusters.add_subparsers(dest="command", required=True)

    def command(name: str, handler, help: str, parents=()) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help, parents=[connection, *parents])
        sub.set_defaults(handler=handler)
        return sub

    command(
        "create", cmd_create, "request a cluster; --wait until it is ready", [_spec_flags(), _wait_flags()]
    )
    command("preview", cmd_preview, "the plan Volt would make now (allocates nothing)", [_spec_flags()])
    command("get", cmd_get, "one cluster").add_argument("id", type=_cluster_id)
    listing = command("list", cmd_list, "your teams' clusters, newest first")
    listing.add_argument("--status", choices=STATUSES)
    listing.add_argument("--team", help="team slug")
    listing.add_argument("--all-pages", action="store_true", help="every cluster, not only the first page")
    command("events", cmd_events, "a cluster's status changes").add_argument("id", type=_cluster_id)
    waiting = command(
        "wait", cmd_wait, "wait for an existing cluster (as create --wait)", [_wait_flags(wait=False)]
    )
    waiting.add_argument("id", type=_cluster_id)
    ending = command(
        "terminate",
        cmd_terminate,
        "cancel or terminate a cluster; frees its GPUs",
        [_wait_flags(targets=False)],
    )
    ending.add_argument("id", type=_cluster_id)
    ending.add_argument(
        "--ok-if-ended", action="store_true", help="exit 0 if the cluster had already ended (cleanup steps)"
    )
    extending = command("extend", cmd_extend, "move a cluster's end (its --duration) later, e.g. --by 2h")
    extending.add_argument("id", type=_cluster_id)
    extending.add_argument("--by", type=duration_s, required=True, metavar="DURATION", help="30m, 2h, 1d")
    _add_job_commands(resources, connection)
    add_goodput_command(resources, connection)
    return parser


def _client(args: argparse.Namespace) -> Client:
    url = (getattr(args, "url", None) or os.environ.get("VOLT_URL") or DEFAULT_URL).rstrip("/")
    url = url.removesuffix("/api/v1")
    if urllib.parse.urlparse(url).scheme not in ("http", "https"):
        raise UsageError(f"the Volt URL must start with http:// or https://, not {url!r}")
    token = getattr(args, "token", None) or os.environ.get("VOLT_TOKEN", "").strip()
    if not token:
        raise UsageError(
            "no API token: set VOLT_TOKEN (create one in the console under API tokens, "
            "or with `python manage.py create_api_token USERNAME`)"
        )
    return Client(url, token)


def _emit(document: Any) -> None:
    sys.stdout.write(json.dumps(document, indent=2) + "\n")
    sys.stdout.flush()


def _progress(message: str) -> None:
    sys.stderr.write(f"volt: {message}\n")
    sys.stderr.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code (the console script passes it to sys.exit)."""
    try:
        args = build_parser().parse_args(argv)
        if getattr(args, "timeout", 1) <= 0:
            raise UsageError("--timeout must be more than 0 seconds")
        return args.handler(_client(args), args)
    except CliError as exc:
        _progress(str(exc))
        return exc.exit_code
    except SystemExit as exc:  # --help and --version
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    except KeyboardInterrupt:
        _progress("interrupted; the cluster keeps its state (volt clusters terminate ID to stop it)")
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
