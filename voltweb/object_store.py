"""Volt's side of the checkpoint store: an S3-compatible endpoint (SeaweedFS embedded by default,
voltweb/embedded_store.py; any S3 store with an AWS-style IAM API in production), one bucket, and one
identity per cluster that the *store* confines to the cluster's prefix.

    Volt (admin key) ── IAM API: CreateUser <name>, CreateAccessKey, PutUserPolicy
                        (s3:GetObject/PutObject/DeleteObject on <bucket>/<prefix>*, s3:ListBucket on the bucket
                        with the s3:prefix condition) → the key pair goes to the cluster's nodes alone
    a job (its key)  ── S3 API: only under its prefix; anything else is "AccessDenied" from the store

The confinement is the store's own policy evaluation, not a check in Volt: a job talks to the store
directly with its key. `revoke` deletes the identity (keys, policy, user); a revoked key is refused
("InvalidAccessKeyId"). Everything here is idempotent: grant again replaces the identity's keys.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass

POLICY_NAME = "volt-prefix"
EFFECTIVE_TIMEOUT_S = 15.0
_NAME = re.compile(r"^[A-Za-z0-9+=,.@_-]{1,64}$")


class StoreUnavailable(RuntimeError):
    """The store did not answer or refused Volt's own key; the message says which and what to check."""


@dataclass(frozen=True)
class Credentials:
    """What a cluster's nodes get: their key, where their prefix is."""

    endpoint: str
    region: str
    bucket: str
    prefix: str
    access_key: str
    secret_key: str


class Store:
    """The store as Volt's admin identity sees it."""

    def __init__(self, endpoint: str, region: str, access_key: str, secret_key: str, bucket: str = ""):
        self.endpoint, self.region, self.bucket, self.access_key = endpoint, region, bucket, access_key
        self._keys = {"aws_access_key_id": access_key, "aws_secret_access_key": secret_key}

    @property
    def secret_key(self) -> str:
        return self._keys["aws_secret_access_key"]

    def client(self, service: str = "s3", access_key: str | None = None, secret_key: str | None = None):
        import boto3  # heavy: only where the store is used
        from botocore.config import Config

        keys = self._keys if access_key is None else {"aws_access_key_id": access_key,
                                                       "aws_secret_access_key": secret_key}  # fmt: skip
        config = Config(
            s3={"addressing_style": "path"}, retries={"max_attempts": 2}, connect_timeout=5, read_timeout=60
        )
        return boto3.client(
            service, endpoint_url=self.endpoint, region_name=self.region, config=config, **keys
        )

    def _call(self, what: str, call):
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return call()
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied"):
                raise StoreUnavailable(
                    f"the checkpoint store at {self.endpoint} refused Volt's key ({code}) for {what}: check "
                    "VOLT_STORE_ACCESS_KEY and VOLT_STORE_SECRET_KEY (an identity with admin rights)"
                ) from None
            raise
        except BotoCoreError as exc:
            raise StoreUnavailable(
                f"the checkpoint store at {self.endpoint} did not answer ({what}): {exc}"
            ) from None

    def list_buckets(self) -> list[str]:
        body = self._call("listing buckets", lambda: self.client().list_buckets())
        return [b["Name"] for b in body.get("Buckets", [])]

    def ensure_bucket(self) -> None:
        from botocore.exceptions import ClientError

        s3 = self.client()
        try:
            self._call(f"creating bucket {self.bucket}", lambda: s3.create_bucket(Bucket=self.bucket))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in (
                "BucketAlreadyOwnedByYou",
                "BucketAlreadyExists",
            ):
                raise

    def grant(self, name: str, prefix: str) -> Credentials:
        """An identity `name` that can read, write, delete and list under `prefix` alone (its old keys, if it
        existed, removed); returns its new key pair."""
        if not _NAME.match(name) or not prefix or prefix.startswith("/") or not prefix.endswith("/"):
            raise ValueError(f"identity {name!r} / prefix {prefix!r}: a user name and a 'folder/' prefix")
        from botocore.exceptions import ClientError

        iam = self.client("iam")
        self.ensure_bucket()
        if not self._exists(iam, name):
            try:
                self._call(f"creating identity {name}", lambda: iam.create_user(UserName=name))
            except ClientError as exc:  # another grant made it meanwhile
                if exc.response.get("Error", {}).get("Code") != "EntityAlreadyExists":
                    raise
        try:
            return self._confine_and_key(iam, name, prefix)
        except BaseException:
            # Nothing half-made stays: an identity without a working key (its old keys are gone already).
            try:
                self.revoke(name)
            except Exception:  # noqa: BLE001 - the first error is the one to report
                pass
            raise

    def _confine_and_key(self, iam, name: str, prefix: str) -> Credentials:
        policy = {
            "Version": "2012-10-17",
            "Statement": [
                {"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
                 "Resource": [f"arn:aws:s3:::{self.bucket}/{prefix}*"]},
                {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": [f"arn:aws:s3:::{self.bucket}"],
                 "Condition": {"StringLike": {"s3:prefix": [f"{prefix}*"]}}},
            ],
        }  # fmt: skip
        self._call(
            f"confining {name} to {prefix}",
            lambda: iam.put_user_policy(
                UserName=name, PolicyName=POLICY_NAME, PolicyDocument=json.dumps(policy)
            ),
        )
        key = self._call(f"a key for {name}", lambda: iam.create_access_key(UserName=name))["AccessKey"]
        credentials = Credentials(
            self.endpoint, self.region, self.bucket, prefix, key["AccessKeyId"], key["SecretAccessKey"]
        )
        self._drop_keys(iam, name, keep=credentials.access_key)  # one key per identity, even when grants race
        self._wait_effective(credentials)
        return credentials

    def _wait_effective(self, credentials: Credentials, timeout_s: float | None = None) -> None:
        """Until the store takes the new key (a gateway learns identities from its filer a moment later):
        its first use on a node must not fail."""
        from botocore.exceptions import ClientError

        timeout_s = EFFECTIVE_TIMEOUT_S if timeout_s is None else timeout_s

        s3 = self.client(access_key=credentials.access_key, secret_key=credentials.secret_key)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                s3.list_objects_v2(Bucket=self.bucket, Prefix=credentials.prefix, MaxKeys=1)
                return
            except ClientError as exc:
                code = exc.response.get("Error", {}).get("Code", "")
                if time.monotonic() > deadline:
                    why = (
                        "its policy does not let it list its own prefix (does the store evaluate s3:prefix?)"
                        if code == "AccessDenied"
                        else f"the key is still unknown to it ({code})"
                    )
                    raise StoreUnavailable(
                        f"the checkpoint store at {self.endpoint} did not take a new key in {timeout_s:g} s: {why}"
                    ) from None
            time.sleep(0.2)

    def revoke(self, name: str) -> bool:
        """Delete identity `name` (keys, policy, user); False when there was none."""
        from botocore.exceptions import ClientError

        iam = self.client("iam")
        if not self._exists(iam, name):
            return False
        self._drop_keys(iam, name)
        try:
            iam.delete_user_policy(UserName=name, PolicyName=POLICY_NAME)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "NoSuchEntity":
                raise
        self._call(f"deleting identity {name}", lambda: iam.delete_user(UserName=name))
        return True

    def identities(self) -> list[str]:
        iam = self.client("iam")
        return [u["UserName"] for u in self._call("listing identities", iam.list_users).get("Users", [])]

    def _exists(self, iam, name: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self._call(f"looking up {name}", lambda: iam.get_user(UserName=name))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "NoSuchEntity":
                return False
            raise
        return True

    def _drop_keys(self, iam, name: str, keep: str = "") -> None:
        keys = self._call(f"{name}'s keys", lambda: iam.list_access_keys(UserName=name))
        for key in keys.get("AccessKeyMetadata", []):
            if key["AccessKeyId"] != keep:
                iam.delete_access_key(UserName=name, AccessKeyId=key["AccessKeyId"])


def from_settings() -> Store | None:
    """The configured store (VOLT_STORE_*), or None when Volt has none."""
    from django.conf import settings

    if not settings.VOLT_STORE_ENDPOINT:
        return None
    return Store(
        settings.VOLT_STORE_ENDPOINT,
        settings.VOLT_STORE_REGION,
        settings.VOLT_STORE_ACCESS_KEY,
        settings.VOLT_STORE_SECRET_KEY,
        settings.VOLT_STORE_BUCKET,
    )
