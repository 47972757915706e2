"""Volt's copy of each job's code: an upload unpacked safely, the folder Ray ships, pruned when no
resubmission can need it. Below the job operations (jobs.services) and the job state machine
(jobs.transitions prunes a finished job's copy)."""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import shutil
import tarfile
import uuid
import zipfile
from contextlib import nullcontext
from pathlib import Path

from django.conf import settings

from jobs.models import Job
from voltweb import datadir
from voltweb.domain import DomainError

WORKLOADS_DIR = Path(__file__).resolve().parent / "workloads"
CKPT_MODULE = "volt_ckpt.py"
# Shipped beside every job's entrypoint: the checkpoint protocol, its events, its store client.
SHIPPED_MODULES = (CKPT_MODULE, "volt_events.py", "volt_store.py")
MIB = 1024 * 1024


class JobInputError(DomainError, ValueError):
    """The request cannot be run as written: the message says what to change (API: 400)."""

    code = "invalid"
    status = 400


def workdirs_root() -> Path:
    """Volt's copies of the jobs' code (a team's, not for other clusters' users to read): 0700."""
    return datadir.private_dir(Path(settings.VOLT_DATA_DIR) / "job-workdirs")


def prepare_working_dir(job: Job, source: Path | None) -> Path:
    """The folder Ray ships for `job`: a copy of `source` (or empty) with Volt's modules (volt_ckpt.py, ...)
    beside the entrypoint."""
    dest = workdirs_root() / str(job.pk)
    if dest.exists():
        shutil.rmtree(dest)
    if source is not None:
        shutil.copytree(source, dest, symlinks=False, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    else:
        dest.mkdir(parents=True)
    for name in SHIPPED_MODULES:
        shutil.copy2(WORKLOADS_DIR / name, dest / name)
    return dest


def prune_working_dir(job_id: int) -> None:
    """Remove a job's copy of its working dir once nothing can submit it again: the job succeeded or was
    stopped, or its cluster ended (a failed job on a live cluster may still be resumed by recovery).
    Ray keeps what it was given at submission; this copy only served resubmissions."""
    shutil.rmtree(workdirs_root() / str(int(job_id)), ignore_errors=True)


def unpack_upload(upload, *, max_bytes: int | None = None) -> Path:
    """Unpack an uploaded .zip / .tar.gz / .tgz / .tar working dir into a new folder; JobInputError if it is
    too large (compressed or unpacked), of another kind, damaged, or holds paths outside itself."""
    limit = max_bytes or settings.VOLT_JOB_UPLOAD_MAX_MB * MIB
    name = (getattr(upload, "name", "") or "").lower()
    size = getattr(upload, "size", None) or 0
    too_large = (
        f"The working directory archive is larger than {limit // MIB} MiB (VOLT_JOB_UPLOAD_MAX_MB): leave data "
        "sets and checkpoints out of it and read them from the cluster's shared storage."
    )
    if size > limit:
        raise JobInputError(too_large)
    dest = workdirs_root() / "uploads" / uuid.uuid4().hex
    dest.mkdir(parents=True)
    try:
        if name.endswith(".zip"):
            _unzip(upload, dest, limit, too_large)
        elif name.endswith((".tar.gz", ".tgz", ".tar")):
            _untar(upload, dest, limit, too_large)
        else:
            raise JobInputError("working_dir must be a .zip or .tar.gz archive of the job's folder.")
    except JobInputError:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError, ValueError) as exc:
        shutil.rmtree(dest, ignore_errors=True)
        raise JobInputError(f"working_dir could not be unpacked ({_unpack_problem(exc, dest)}).") from None
    return dest


def _unpack_problem(exc: BaseException, dest: Path) -> str:
    """What went wrong unpacking into `dest`, naming paths inside the archive only: the server's folders
    (VOLT_DATA_DIR, the staging folder) are nobody's business (OSErrors and tarfile's filter errors carry
    absolute paths)."""
    if isinstance(exc, OSError) and exc.strerror:
        where = "".join(f" at {_inside(name, dest)!r}" for name in (exc.filename, exc.filename2) if name)
        return f"{type(exc).__name__}: {exc.strerror}{where}"
    text = str(exc)
    for folder in sorted({str(dest), os.path.realpath(dest)}, key=len, reverse=True):
        text = text.replace(folder + os.sep, "").replace(folder, ".")
    for folder in {str(settings.VOLT_DATA_DIR), os.path.realpath(settings.VOLT_DATA_DIR)}:
        text = text.replace(folder, "<server>")
    return f"{type(exc).__name__}: {text}"


def _inside(name, dest: Path) -> str:
    """`name` relative to the staging folder `dest`, or only its last part if it lies elsewhere."""
    path = os.fsdecode(name)
    for folder in (str(dest), os.path.realpath(dest)):
        if path == folder or path.startswith(folder + os.sep):
            return os.path.relpath(path, folder)
    return os.path.basename(path)


def _safe_member(name: str) -> bool:
    parts = Path(name).parts
    return bool(name) and not Path(name).is_absolute() and ".." not in parts and "\x00" not in name


def _unzip(upload, dest: Path, limit: int, too_large: str) -> None:
    with zipfile.ZipFile(upload) as archive:
        members = archive.infolist()
        if sum(m.file_size for m in members) > limit:
            raise JobInputError(too_large + " (unpacked)")
        for member in members:
            if not _safe_member(member.filename):
                raise JobInputError(
                    f"working_dir holds a path outside its folder: {member.filename[:100]!r}."
                )
            if (member.external_attr >> 16) & 0o170000 == 0o120000:
                raise JobInputError(
                    f"working_dir holds a symbolic link ({member.filename[:100]}): not allowed."
                )
        archive.extractall(dest)


# Compressed tar streams tarfile would open, by their first bytes. Decompressed here, behind a bound.
_DECOMPRESSORS = (
    (b"\x1f\x8b", lambda upload: gzip.GzipFile(fileobj=upload, mode="rb")),
    (b"BZh", bz2.BZ2File),
    (b"\xfd7zXZ\x00", lzma.LZMAFile),
)


class _BoundedStream:
    """A (decompressed) archive stream that refuses to be read or sought past `bound` bytes.

    tarfile lists members by seeking over their data, which for a compressed stream means inflating it: a
    4 MB gzip bomb took 35-39 s of CPU to list before its size was checked. Through this, inflating stops
    (JobInputError) as soon as a read or a seek would pass the bound; a seek past it inflates nothing."""

    def __init__(self, raw, bound: int, refusal: str):
        self.raw, self.bound, self.refusal = raw, bound, refusal

    def read(self, size: int | None = -1) -> bytes:
        room = self.bound - self.raw.tell()
        if size is not None and 0 <= size <= room:
            return self.raw.read(size)
        data = self.raw.read(max(room, 0) + 1 if size is None or size < 0 else min(size, max(room, 0) + 1))
        if len(data) > room:
            raise JobInputError(self.refusal)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        target = offset + (self.raw.tell() if whence == 1 else 0)
        if whence not in (0, 1) or target > self.bound:
            raise JobInputError(self.refusal)
        return self.raw.seek(target)

    def tell(self) -> int:
        return self.raw.tell()


def _untar(upload, dest: Path, limit: int, too_large: str) -> None:
    upload.seek(0)
    magic = upload.read(6)
    upload.seek(0)
    opener = next((opener for prefix, opener in _DECOMPRESSORS if magic.startswith(prefix)), None)
    raw = opener(upload) if opener is not None else upload
    # Tar headers and padding (512 bytes a member, at least) come on top of the files' content: a folder of
    # many small files takes more stream than content, so the stream may be twice the content's limit.
    stream = _BoundedStream(raw, 2 * limit, too_large + " (unpacked)")
    with raw if raw is not upload else nullcontext(), tarfile.open(fileobj=stream, mode="r:") as archive:
        members = archive.getmembers()
        if sum(m.size for m in members if m.isfile()) > limit:
            raise JobInputError(too_large + " (unpacked)")
        for member in members:
            if not _safe_member(member.name) or not (member.isfile() or member.isdir()):
                raise JobInputError(
                    f"working_dir holds {member.name[:100]!r}: only plain files and folders inside it are allowed."
                )
        archive.extractall(dest, filter="data")
