"""volt_store: a job's view of Volt's checkpoint store, an S3-compatible bucket (issue 27).

Runs ON a cluster, shipped beside volt_ckpt (plain Python and boto3, which Volt's runtime holds; nothing
of Volt). volt_ckpt uses it when a checkpoint root is an `s3://bucket/prefix` URL; the cluster's own key,
which the store confines to the cluster's prefix, comes from the environment Volt gives every job:

    VOLT_STORE_ENDPOINT  VOLT_STORE_REGION  VOLT_STORE_ACCESS_KEY  VOLT_STORE_SECRET_KEY

Objects carry the sha256 of their bytes as user metadata (`x-amz-meta-sha256`), set by the uploader, so a
listing can tell a shard that arrived whole from one that did not without reading it back; whoever loads a
checkpoint still hashes what it downloaded.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

SCHEME = "s3://"
# Shards above this go up in parts (S3's multipart upload), each this large, several at once.
MULTIPART_BYTES = 16 * 1024 * 1024
PART_CONCURRENCY = 4
ENV = ("VOLT_STORE_ENDPOINT", "VOLT_STORE_REGION", "VOLT_STORE_ACCESS_KEY", "VOLT_STORE_SECRET_KEY")


class StoreError(Exception):
    """The store cannot be used (no credentials, refused, unreachable); the message says why."""


def is_store(root: str | os.PathLike) -> bool:
    return str(root).startswith(SCHEME)


def split(url: str) -> tuple[str, str]:
    """(bucket, key) of `s3://bucket/key`; the key without a trailing slash."""
    if not is_store(url):
        raise StoreError(f"{url!r} is not an s3:// URL")
    bucket, _, key = url[len(SCHEME) :].partition("/")
    if not bucket:
        raise StoreError(f"{url!r} names no bucket")
    return bucket, key.strip("/")


def join(url: str, *parts: str) -> str:
    return "/".join([url.rstrip("/"), *(str(p).strip("/") for p in parts)])


class Store:
    """One identity's client of the store."""

    def __init__(self, endpoint: str, region: str, access_key: str, secret_key: str):
        self.endpoint = endpoint
        self._args = {"endpoint_url": endpoint, "region_name": region or "us-east-1",
                      "aws_access_key_id": access_key, "aws_secret_access_key": secret_key}  # fmt: skip
        self._client = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Store:
        env = os.environ if env is None else env
        missing = [name for name in ENV if name != "VOLT_STORE_REGION" and not env.get(name)]
        if missing:
            raise StoreError(
                f"checkpoints go to the store but {', '.join(missing)} is not set: Volt sets them for every job "
                "of a cluster that has a store identity"
            )
        return cls(*(env.get(name, "") for name in ENV))

    @property
    def client(self):
        if self._client is None:
            import boto3
            from botocore.config import Config

            # No CRC32 of every part on top of the sha256 volt_ckpt computes once and records (botocore adds
            # one by default since 1.36), and no SigV4 hash of every body (botocore's default over plain
            # HTTP): each is one more pass over the shard that training's CPU pays for on small machines. The
            # recorded sha256 is a signed header, and whoever loads a shard hashes what it downloaded.
            config = Config(s3={"addressing_style": "path", "payload_signing_enabled": False}, retries={"max_attempts": 4, "mode": "standard"},
                            connect_timeout=5, read_timeout=120, request_checksum_calculation="when_required",
                            response_checksum_validation="when_required")  # fmt: skip
            # A session of its own: boto3's default session is not safe to share between threads.
            self._client = boto3.session.Session().client("s3", config=config, **self._args)
        return self._client

    def _transfer(self):
        from boto3.s3.transfer import TransferConfig

        return TransferConfig(
            multipart_threshold=MULTIPART_BYTES, multipart_chunksize=MULTIPART_BYTES,
            max_concurrency=PART_CONCURRENCY, use_threads=True,
        )  # fmt: skip

    def upload_file(self, path: str | os.PathLike, url: str, sha256: str, **metadata: str) -> None:
        """Upload a file (in parts when large) with its sha256, and any other `metadata`, on the object."""
        bucket, key = split(url)
        extra = {"Metadata": {"sha256": sha256, **metadata}}
        self._call(
            f"uploading {url}",
            lambda: self.client.upload_file(str(path), bucket, key, ExtraArgs=extra, Config=self._transfer()),
        )

    def download_file(self, url: str, path: str | os.PathLike) -> None:
        bucket, key = split(url)
        target = Path(path)
        tmp = target.with_name(f".{target.name}.part-{os.getpid()}")
        self._call(
            f"downloading {url}",
            lambda: self.client.download_file(bucket, key, str(tmp), Config=self._transfer()),
        )
        os.replace(tmp, target)

    def put_bytes(self, url: str, data: bytes, sha256: str = "") -> None:
        bucket, key = split(url)
        extra = {"Metadata": {"sha256": sha256}} if sha256 else {}
        self._call(
            f"writing {url}", lambda: self.client.put_object(Bucket=bucket, Key=key, Body=data, **extra)
        )

    def get_bytes(self, url: str) -> bytes | None:
        """The object's bytes; None when there is no such object."""
        bucket, key = split(url)
        try:
            return self._call(
                f"reading {url}", lambda: self.client.get_object(Bucket=bucket, Key=key)["Body"].read()
            )
        except FileNotFoundError:
            return None

    def head(self, url: str) -> tuple[int, str] | None:
        """(size, the sha256 its uploader recorded) of the object; None when there is no such object."""
        found = self.info(url)
        return None if found is None else (found[0], found[1].get("sha256", ""))

    def info(self, url: str) -> tuple[int, dict[str, str]] | None:
        """(size, the metadata its uploader recorded) of the object; None when there is no such object."""
        bucket, key = split(url)
        try:
            found = self._call(f"looking up {url}", lambda: self.client.head_object(Bucket=bucket, Key=key))
        except FileNotFoundError:
            return None
        return int(found["ContentLength"]), {
            k.lower(): str(v) for k, v in (found.get("Metadata") or {}).items()
        }

    def listing(self, url: str) -> tuple[list[str], dict[str, int]]:
        """(the names of the 'folders' right under `url`, {file name: size} right under it)."""
        bucket, key = split(url)
        prefix = f"{key}/" if key else ""
        folders: list[str] = []
        files: dict[str, int] = {}
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=prefix, Delimiter="/"
        )
        for page in self._call(f"listing {url}", lambda: list(pages)):
            folders += [p["Prefix"][len(prefix) :].rstrip("/") for p in page.get("CommonPrefixes", [])]
            # (a store that keeps folders, as SeaweedFS does, may list the folder itself as an empty key)
            files.update({o["Key"][len(prefix) :]: int(o["Size"]) for o in page.get("Contents", [])
                          if o["Key"] != prefix})  # fmt: skip
        return folders, files

    def delete_folder(self, url: str) -> int:
        """Remove every object under `url`/; how many there were."""
        bucket, key = split(url)
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{key}/")
        keys = [
            o["Key"]
            for page in self._call(f"listing {url}", lambda: list(pages))
            for o in page.get("Contents", [])
        ]
        removed = 0
        # The folder's own entry last, where the store keeps one (SeaweedFS): the listing forgets it then.
        keys = sorted(keys, key=lambda k: k == f"{key}/") + ([] if f"{key}/" in keys else [f"{key}/"])
        for start in range(0, len(keys), 1000):
            batch = [{"Key": k} for k in keys[start : start + 1000]]
            answer = self._call(f"deleting under {url}", lambda b=batch: self.client.delete_objects(
                Bucket=bucket, Delete={"Objects": b, "Quiet": True}))  # fmt: skip
            errors = [e for e in answer.get("Errors", []) if e.get("Key") != f"{key}/"]
            if errors:
                raise StoreError(f"the checkpoint store kept {errors[0]['Key']}: {errors[0].get('Code')}")
            removed += len(batch)
        return removed

    def _call(self, what: str, call):
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return call()
        except ClientError as exc:
            error = exc.response.get("Error", {})
            code = str(error.get("Code", ""))
            if code in ("NoSuchKey", "404", "NotFound"):
                raise FileNotFoundError(what) from None
            raise StoreError(
                f"the checkpoint store at {self.endpoint} refused {what}: {code} {error.get('Message', '')}".rstrip()
            ) from None
        except BotoCoreError as exc:
            raise StoreError(
                f"the checkpoint store at {self.endpoint} did not answer ({what}): {exc}"
            ) from None
