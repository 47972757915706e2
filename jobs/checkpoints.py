"""A job's checkpoints: scanned from its storage on the head host (as the cluster's own user), recorded as
rows, the latest synchronized one found for recovery."""

from __future__ import annotations

import json
import logging
import shlex
import tarfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import PurePosixPath
from typing import Any

from django.conf import settings
from django.utils import timezone

from clusters import checkpoint_store
from clusters.provisioning import ray_nodes
from clusters.tenancy import (
    node_driver,
    node_user_prefix,
    ray_cluster_id,
    storage_location,
)
from inventory import local_runtime, runtimes
from inventory.choices import DriverKind
from inventory.drivers.base import DriverError
from jobs import onray, transitions
from jobs.choices import LIVE
from jobs.models import Checkpoint, Job
from jobs.workdirs import (
    CKPT_MODULE,
    WORKLOADS_DIR,
)
from jobs.workloads import volt_ckpt, volt_store
from voltweb import object_store, realtime
from voltweb.domain import DomainError

logger = logging.getLogger(__name__)


def store_client(cluster) -> volt_store.Store | None:
    """A client of the checkpoint store with the cluster's own key (what its jobs have); None without one."""
    environment = checkpoint_store.job_environment(cluster)
    if not environment:
        return None
    # Volt reaches the store at its own endpoint (the nodes' may be an address only they can use).
    return volt_store.Store(settings.VOLT_STORE_ENDPOINT, *(environment[name] for name in volt_store.ENV[1:]))


def scan_storage(job: Job) -> list[dict]:
    """volt_ckpt.scan of the job's checkpoint dir. In the store: from here, with the cluster's own key. On
    shared storage: on the cluster's head host through its driver, as the user its Ray runs as: the folder
    is the job's to write, and Volt does not walk it with more rights than the job has
    (tenancy.as_node_user). Local hosts run the module from this machine's source; SSH hosts get a copy in
    the cluster's workdir."""
    root = onray.checkpoint_dir(job)
    if volt_ckpt.is_store(root):
        client = store_client(job.cluster)
        if client is None:  # the cluster ended and its key with it: what was recorded stays as it is
            raise DriverError(f"cluster {job.cluster_id} has no key in the checkpoint store any more")
        try:
            return volt_ckpt.scan(root, store=client)
        except volt_store.StoreError as exc:
            raise DriverError(str(exc)) from None
    nodes = onray.live_nodes(job.cluster)
    if not nodes:
        return []
    head = nodes[0]
    folder = onray.checkpoint_dir(job).replace("${HOME}", "$HOME")
    with node_driver(head.host) as driver:
        if head.host.driver == DriverKind.LOCAL:
            module, python = str(WORKLOADS_DIR / CKPT_MODULE), local_runtime.python_for_local_hosts()
        else:
            workdir = ray_nodes.workdir_for(ray_cluster_id(job.cluster))
            driver.copy_file(WORKLOADS_DIR / CKPT_MODULE, f"{workdir}/{CKPT_MODULE}")
            module, python = f"$HOME/{workdir}/{CKPT_MODULE}", runtimes.python_of(head.host)
        # No folder yet: no checkpoints. A scan that fails (no Python, the module missing, a folder the
        # cluster's user cannot read) is an error, not "no checkpoints": recovery would resume from scratch
        # without a word. The module is read by Volt's shell and handed over as code: the cluster's user
        # need not reach Volt's source, and runs it with nothing of Volt's environment.
        switch = node_user_prefix(job.cluster, head.host)
        clean = "env -i PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 " if switch else ""
        command = (
            f'if [ -d "{folder}" ]; then code="$(cat "{module}")" && '
            f'{switch}{clean}{shlex.quote(python)} -c "$code" scan "{folder}"; else echo "[]"; fi'
        )
        result = driver.run(command, timeout=60)
    if not result.ok:
        raise DriverError(f"checkpoint scan failed on {nodes[0].host.name}: {result.stderr.strip()[:300]}")
    # The scan prints indented JSON (a list: its first line is "[" at the margin), perhaps after whatever
    # the user's shell rc files print.
    lines = result.stdout.splitlines()
    starts = [number for number, line in enumerate(lines) if line.startswith("[")]
    if not starts:
        raise ValueError(f"checkpoint scan on {nodes[0].host.name} printed no list: {result.stdout[-300:]!r}")
    return json.loads("\n".join(lines[starts[-1] :]))


def rescan_checkpoints(job: Job) -> list[Checkpoint]:
    """Record what is on storage now: one Checkpoint row per `step-*` folder, synchronized or why not."""
    try:
        found = scan_storage(job)
    except (DriverError, OSError, ValueError) as exc:
        logger.warning("job %s: checkpoint scan failed: %s", job.pk, exc)
        return list(job.checkpoints.all())
    removed = apply_retention(job, found)
    seen = set()
    for entry in found:
        seen.add(entry["path"])
        if entry["path"] in removed:
            entry = entry | {"synchronized": False, "reason": removed[entry["path"]]}
        created = number(entry.get("created"))
        save_s = number(entry.get("save_s"))
        Checkpoint.objects.update_or_create(
            job=job,
            path=entry["path"],
            defaults={
                "step": int(entry.get("step") or 0),
                "size_bytes": int(entry.get("bytes") or 0),
                "created": datetime.fromtimestamp(created, UTC) if created else None,
                "synchronized": bool(entry.get("synchronized")),
                "reason": str(entry.get("reason") or "")[:1000],
                "world_size": entry.get("world_size") if isinstance(entry.get("world_size"), int) else None,
                "save_s": save_s if save_s is not None and 0 <= save_s <= 7 * 86400 else None,
            },
        )
    job.checkpoints.exclude(path__in=seen).exclude(reason__startswith=RETENTION).update(
        synchronized=False, reason="no longer in its storage"
    )
    rows = list(job.checkpoints.all())
    realtime.broadcast(
        f"cluster-{job.cluster_id}",
        {"kind": "job_checkpoints", "job": job.pk, "checkpoints": [checkpoint_payload(c) for c in rows]},
    )
    return rows


RETENTION = "removed by retention"


def apply_retention(job: Job, found: list[dict]) -> dict[str, str]:
    """In the store: remove all but the last VOLT_CHECKPOINT_KEEP synchronized checkpoints of the job (while
    it runs, never the one its attempt resumed from: a user may resume from an older one than the last K), and incomplete ones that can no longer complete: older than the latest
    synchronized one (a run resumes from that and saves only later steps), or, once the job has ended, first
    seen more than VOLT_CHECKPOINT_INCOMPLETE_GRACE_S ago. An incomplete one past the latest synchronized step
    of a live job may be uploading: it stays. {path: why} of those removed; their rows stay (the job's goodput
    counts their save time), marked not synchronized with that reason."""
    if not found or not volt_ckpt.is_store(found[0]["path"]):
        return {}
    client = store_client(job.cluster)
    if client is None:
        return {}
    keep, grace = settings.VOLT_CHECKPOINT_KEEP, settings.VOLT_CHECKPOINT_INCOMPLETE_GRACE_S
    synchronized = [entry for entry in found if entry["synchronized"]]
    doomed = {entry["path"]: f"{RETENTION}: the job keeps its last {keep} synchronized checkpoints"
              for entry in synchronized[: max(0, len(synchronized) - keep)]}  # fmt: skip
    latest = synchronized[-1]["step"] if synchronized else -1
    first_seen = dict(job.checkpoints.values_list("path", "discovered_at"))
    cutoff = timezone.now() - timedelta(seconds=grace)
    ended = job.status not in LIVE
    for entry in found:
        if entry["synchronized"]:
            continue
        seen_at = first_seen.get(entry["path"])
        if entry["step"] < latest:
            doomed[entry["path"]] = (
                f"{RETENTION}: incomplete, and older than step {latest} ({entry['reason']})"
            )
        elif ended and seen_at is not None and seen_at < cutoff:
            doomed[entry["path"]] = f"{RETENTION}: incomplete for more than {grace:g} s ({entry['reason']})"
    if not ended:
        doomed.pop(job.resume_from, None)
    removed = {}
    for path, why in doomed.items():
        try:
            client.delete_folder(path)
        except volt_store.StoreError as exc:  # tried again at the next scan
            logger.warning("job %s: retention could not remove %s: %s", job.pk, path, exc)
            continue
        removed[path] = why
    if removed:
        steps = ", ".join(path.rsplit("/", 1)[-1] for path in removed)
        transitions.note(job, f"checkpoint retention removed {steps} from the store")
    return removed


class NotDownloadable(DomainError):
    """The checkpoint cannot be downloaded as it is; the message says why (API: 409)."""

    code = "not_downloadable"


def archive_name(c: Checkpoint) -> str:
    return f"job-{c.job_id}-{PurePosixPath(c.path).name}.tar"


def checkpoint_archive(c: Checkpoint) -> Iterator[bytes]:
    """A synchronized checkpoint in the store as one tar stream (step-N/manifest.json, then its shards),
    read with Volt's own key: the cluster's went with it, its checkpoints did not. NotDownloadable for one
    on a cluster's shared storage, or not synchronized. Checked before the first byte is sent."""
    if not volt_ckpt.is_store(c.path):
        raise NotDownloadable(
            "This checkpoint is on the cluster's shared storage, not in the checkpoint store: copy it from the "
            "cluster (its connect box says where)."
        )
    if not c.synchronized:
        raise NotDownloadable(
            f"Checkpoint step {c.step} is not synchronized ({c.reason}): only whole ones download."
        )
    admin = object_store.from_settings()
    if admin is None:
        raise NotDownloadable("Volt has no checkpoint store configured any more (VOLT_STORE_ENDPOINT).")
    store = volt_store.Store(admin.endpoint, admin.region, admin.access_key, admin.secret_key)
    try:
        # Checked again now, with Volt's key: the job (its cluster's key) could have rewritten the manifest
        # since the scan. Only shard names of the protocol's form, each under the checkpoint's own prefix.
        manifest, reason = volt_ckpt.verify(c.path, store=store)
    except volt_store.StoreError as exc:
        raise NotDownloadable(f"Checkpoint step {c.step} cannot be read from the store: {exc}") from None
    if reason or manifest is None:
        raise NotDownloadable(f"Checkpoint step {c.step} is not synchronized any more ({reason}).")
    if not all(volt_ckpt.SHARD_RE.match(str(entry.get("file", ""))) for entry in manifest["shards"]):
        raise NotDownloadable(f"Checkpoint step {c.step}'s manifest names files that are not shards.")
    return _tar_stream(store, c.path, manifest)


def _tar_stream(store, path: str, manifest: dict) -> Iterator[bytes]:
    folder = PurePosixPath(path).name
    body = json.dumps(manifest, indent=1).encode()
    files = [(volt_ckpt.MANIFEST, len(body), None)] + [
        (entry["file"], int(entry["bytes"]), f"{path}/{entry['file']}") for entry in manifest["shards"]
    ]
    for name, size, url in files:
        info = tarfile.TarInfo(f"{folder}/{name}")
        info.size, info.mode, info.mtime = size, 0o644, int(manifest.get("created") or 0)
        yield info.tobuf(format=tarfile.PAX_FORMAT)
        if url is None:
            yield body
        else:
            bucket, key = volt_store.split(url)
            sent = 0
            for chunk in store.client.get_object(Bucket=bucket, Key=key)["Body"].iter_chunks(1 << 20):
                sent += len(chunk)
                yield chunk
            if sent != size:  # the archive would be silently wrong: cut it short instead
                raise volt_store.StoreError(f"{url}: {sent} bytes read, the manifest says {size}")
        if size % tarfile.BLOCKSIZE:
            yield b"\0" * (tarfile.BLOCKSIZE - size % tarfile.BLOCKSIZE)
    yield b"\0" * (2 * tarfile.BLOCKSIZE)


class DownloadRefused(DomainError, PermissionError):
    """A checkpoint is the team's data: only members of the cluster's team download it (API: 403)."""

    code = "team_members_only"
    status = 403


def check_may_download(c: Checkpoint, user) -> None:
    if not (user.is_authenticated and c.job.cluster.team.memberships.filter(user=user).exists()):
        raise DownloadRefused("Only members of the cluster's team download its checkpoints.")


def download_url(c: Checkpoint) -> str | None:
    """Where the team downloads the checkpoint (a tar of its manifest and shards); None when it cannot."""
    if not (c.synchronized and volt_ckpt.is_store(c.path)):
        return None
    return f"/api/v1/jobs/{c.job_id}/checkpoints/{c.step}/download/"


def checkpoint_payload(c: Checkpoint) -> dict:
    return {"step": c.step, "path": c.path, "location": checkpoint_location(c), "size_bytes": c.size_bytes,
            "synchronized": c.synchronized, "reason": c.reason, "download": download_url(c),
            "created": c.created.isoformat() if c.created else None}  # fmt: skip


def checkpoint_location(c: Checkpoint) -> str:
    """Where the checkpoint is: its `s3://` place in the store, or named as the cluster's connect box names its
    storage (`c.path` is then the folder the scan found on the head host; on local hosts, this machine's
    folder behind the storage link)."""
    if volt_ckpt.is_store(c.path):
        return c.path
    job = c.job
    return storage_location(job.cluster, "jobs", job.pk, "checkpoints", PurePosixPath(c.path).name)


def latest_synchronized_checkpoint(job: Job) -> Checkpoint | None:
    """The newest checkpoint every rank finished (rescanned first): the only kind ever resumed from."""
    rescan_checkpoints(job)
    return job.checkpoints.filter(synchronized=True).order_by("-step").first()


def number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number and abs(number) != float("inf") else None
