"""Issue 21 point 3a: a job's upload and a request body are bounded while they are read, not afterwards.

A 4 MB gzip bomb (a working dir archive) cost 35-39 s of CPU before the size check: the whole stream was
inflated to list its members first. A request body without Content-Length (chunked) was read whole before
any check. No wall-clock threshold here: the tests count how much of the input was consumed.
"""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import lzma
import tarfile

import pytest

from jobs import services, workdirs

pytestmark = pytest.mark.django_db(transaction=True)
MIB = 1024 * 1024


class CountingUpload(io.BytesIO):
    """An uploaded file that remembers how far into it anything ever read."""

    def __init__(self, data: bytes, name: str):
        super().__init__(data)
        self.name, self.size, self.furthest = name, len(data), 0

    def read(self, size=-1):
        data = super().read(size)
        self.furthest = max(self.furthest, self.tell())
        return data

    def readinto(self, buffer):
        count = super().readinto(buffer)
        self.furthest = max(self.furthest, self.tell())
        return count


def gzip_member(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=9, mtime=0)


def xz_stream(data: bytes) -> bytes:
    return lzma.compress(data, preset=1)


def tar_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    return info.tobuf(format=tarfile.GNU_FORMAT)


def bomb(expanded_mib: int, files: int = 1, compress=gzip_member) -> bytes:
    """A compressed tar of `files` files of zeros, `expanded_mib` MiB unpacked in all, built from repeated
    compressed members (gzip and xz both read concatenated members as one stream; 16 MiB of zeros is ~16 KB
    of gzip), so a many-GB bomb is built in milliseconds."""
    zeros = compress(b"\0" * (16 * MIB))
    per_file = expanded_mib // files
    parts = []
    for index in range(files):
        parts.append(compress(tar_header(f"f{index}", per_file * MIB)))
        parts += [zeros] * (per_file // 16)
    parts.append(compress(b"\0" * 1024))  # the end-of-archive blocks
    return b"".join(parts)


@pytest.mark.parametrize("expanded_mib, files", [(4096, 1), (4096, 256)])
def test_a_gzip_bomb_is_refused_after_inflating_about_the_limit(expanded_mib, files, settings):
    """4 GiB of zeros in ~4 MB: one huge file, or 256 files of 16 MiB each (each under the limit)."""
    upload = CountingUpload(bomb(expanded_mib, files), "bomb.tar.gz")
    assert upload.size < settings.VOLT_JOB_UPLOAD_MAX_MB * MIB  # the compressed size passes its check

    with pytest.raises(services.JobInputError, match=r"larger than 20 MiB .*\(unpacked\)"):
        workdirs.unpack_upload(upload)

    # Inflating it all means reading it all; stopping near the limit (20 MiB, ~20 KB of this stream
    # per 20 MiB unpacked) means reading a small part of it.
    assert upload.furthest < upload.size // 20, (upload.furthest, upload.size)
    assert not list((workdirs.workdirs_root() / "uploads").iterdir())  # nothing left behind


def test_other_compressions_are_bounded_the_same_way():
    """A `.tar` name does not mean an uncompressed stream: tarfile reads xz and bzip2 too."""
    upload = CountingUpload(bomb(4096, 4, compress=xz_stream), "bomb.tar")

    with pytest.raises(services.JobInputError, match=r"\(unpacked\)"):
        workdirs.unpack_upload(upload)
    assert upload.furthest < upload.size // 20, (upload.furthest, upload.size)


def test_an_archive_within_the_limit_still_unpacks(settings):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for index in range(300):  # many small files: tar headers add more than their content
            content = f"print({index})\n".encode()
            info = tarfile.TarInfo(f"pkg/m{index}.py")
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    folder = workdirs.unpack_upload(CountingUpload(buffer.getvalue(), "wd.tgz"))
    assert (folder / "pkg" / "m299.py").read_text() == "print(299)\n"


# --- request bodies without Content-Length ---------------------------------------------------------------


class ChunkedBody:
    """An ASGI `receive` that sends `chunks` chunks of `chunk_size` bytes, counting what was asked for."""

    def __init__(self, chunks: int, chunk_size: int = 64 * 1024):
        self.chunks, self.chunk_size, self.sent = chunks, chunk_size, 0
        self.done = asyncio.Event()

    async def __call__(self):
        if self.sent >= self.chunks:
            await self.done.wait()  # the client stays connected until the answer is sent
            return {"type": "http.disconnect"}
        self.sent += 1
        return {"type": "http.request", "body": b"x" * self.chunk_size, "more_body": self.sent < self.chunks}


async def call(path: str, content_type: bytes, body: ChunkedBody) -> tuple[int, bytes]:
    from voltweb.asgi import application

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"host", b"localhost"), (b"content-type", content_type),
                    (b"transfer-encoding", b"chunked")],
        "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 80),
    }  # fmt: skip
    messages = []

    async def send(message):
        messages.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            body.done.set()

    await asyncio.wait_for(application(scope, body, send), 60)
    start = next(m for m in messages if m["type"] == "http.response.start")
    return start["status"], b"".join(
        m.get("body", b"") for m in messages if m["type"] == "http.response.body"
    )


@pytest.mark.asyncio
async def test_a_chunked_json_body_is_refused_once_it_passes_the_limit(settings):
    body = ChunkedBody(chunks=1024)  # 64 MiB, far past DATA_UPLOAD_MAX_MEMORY_SIZE (256 KiB)

    status, content = await call("/api/v1/providers/", b"application/json", body)

    assert status == 400
    error = json.loads(content)["error"]
    assert error["code"] == "invalid" and "larger than 262144 bytes" in error["message"]
    assert body.sent <= settings.DATA_UPLOAD_MAX_MEMORY_SIZE // body.chunk_size + 1


@pytest.mark.asyncio
async def test_a_chunked_upload_is_refused_once_it_passes_the_upload_limit(settings):
    settings.VOLT_UPLOAD_MAX_BYTES = 2 * MIB
    body = ChunkedBody(chunks=1024)

    status, content = await call("/api/v1/jobs/", b"multipart/form-data; boundary=x", body)

    assert status == 400
    assert "VOLT_JOB_UPLOAD_MAX_MB" in json.loads(content)["error"]["message"]
    assert body.sent <= 2 * MIB // body.chunk_size + 1


@pytest.mark.asyncio
async def test_a_chunked_console_form_past_the_limit_gets_the_400_page(settings):
    body = ChunkedBody(chunks=1024)

    status, content = await call("/login/", b"application/x-www-form-urlencoded", body)

    assert status == 400 and b"larger than 262144 bytes" in content
    assert body.sent <= settings.DATA_UPLOAD_MAX_MEMORY_SIZE // body.chunk_size + 1


@pytest.mark.asyncio
async def test_a_chunked_body_within_the_limit_reaches_the_view():
    status, content = await call("/api/v1/providers/", b"application/json", ChunkedBody(chunks=2))

    assert status == 401  # no credentials: the API's own answer, so the body got through
    assert json.loads(content)["error"]["code"] == "not_authenticated"
