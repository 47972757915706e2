"""The checkpoint store (issue 27, first part): a real SeaweedFS (`weed server -s3`, the embedded default) and
one identity per cluster that the store itself confines to the cluster's prefix. Each check talks to the
store through the S3 API with the cluster's own key, as a job on a node would: not through Volt."""

from __future__ import annotations

import os
import time

import pytest
from botocore.exceptions import ClientError

from voltweb import object_store

BUCKET = "volt-checkpoints"


@pytest.fixture
def store(store_admin):
    return store_admin


def as_cluster(store: object_store.Store, credentials: object_store.Credentials):
    return store.client(access_key=credentials.access_key, secret_key=credentials.secret_key)


def code_of(call) -> str:
    with pytest.raises(ClientError) as caught:
        call()
    return caught.value.response["Error"]["Code"]


def eventually_refused(call, timeout_s: float = 15.0) -> str:
    """The store learns identity changes from its filer a moment later: the code once `call` is refused."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            call()
        except ClientError as exc:
            return exc.response["Error"]["Code"]
        assert time.monotonic() < deadline, "still accepted"
        time.sleep(0.2)


def test_a_clusters_key_reaches_its_own_prefix_and_the_store_refuses_it_every_other(store):
    team_a = store.grant("volt-t1-c101", "clusters/volt-t1-101/")
    team_b = store.grant("volt-t1-c102", "clusters/volt-t1-102/")
    a, b = as_cluster(store, team_a), as_cluster(store, team_b)
    shard = os.urandom(12 * 1024 * 1024)

    a.put_object(Bucket=BUCKET, Key="clusters/volt-t1-101/job-1/step-10/rank-0.pt", Body=b"state")
    # A large shard goes up in parts (multipart), as checkpoints will.
    upload = a.create_multipart_upload(Bucket=BUCKET, Key="clusters/volt-t1-101/job-1/step-10/rank-1.pt")
    parts = []
    for number, offset in enumerate(range(0, len(shard), 5 * 1024 * 1024), start=1):
        body = shard[offset : offset + 5 * 1024 * 1024]
        etag = a.upload_part(Bucket=BUCKET, Key=upload["Key"], UploadId=upload["UploadId"], PartNumber=number,
                             Body=body)["ETag"]  # fmt: skip
        parts.append({"PartNumber": number, "ETag": etag})
    a.complete_multipart_upload(Bucket=BUCKET, Key=upload["Key"], UploadId=upload["UploadId"],
                                MultipartUpload={"Parts": parts})  # fmt: skip
    assert a.get_object(Bucket=BUCKET, Key=upload["Key"])["Body"].read() == shard
    listed = a.list_objects_v2(Bucket=BUCKET, Prefix="clusters/volt-t1-101/")["Contents"]
    assert sorted(o["Key"].rsplit("/", 1)[1] for o in listed) == ["rank-0.pt", "rank-1.pt"]

    theirs = "clusters/volt-t1-101/job-1/step-10/rank-0.pt"
    assert code_of(lambda: b.get_object(Bucket=BUCKET, Key=theirs)) == "AccessDenied"
    assert code_of(lambda: b.list_objects_v2(Bucket=BUCKET, Prefix="clusters/volt-t1-101/")) == "AccessDenied"
    assert code_of(lambda: b.list_objects_v2(Bucket=BUCKET)) == "AccessDenied"
    assert code_of(lambda: b.put_object(Bucket=BUCKET, Key=theirs, Body=b"evil")) == "AccessDenied"
    assert code_of(lambda: b.delete_object(Bucket=BUCKET, Key=theirs)) == "AccessDenied"
    assert (
        code_of(lambda: b.put_object(Bucket=BUCKET, Key="clusters/volt-t1-1020/x", Body=b"y"))
        == "AccessDenied"
    )
    assert a.get_object(Bucket=BUCKET, Key=theirs)["Body"].read() == b"state"  # untouched
    b.put_object(Bucket=BUCKET, Key="clusters/volt-t1-102/own", Body=b"ok")  # its own prefix works


def test_granting_again_replaces_the_key_and_a_revoked_identity_is_refused(store):
    first = store.grant("volt-t1-c103", "clusters/volt-t1-103/")
    second = store.grant("volt-t1-c103", "clusters/volt-t1-103/")
    old, new = as_cluster(store, first), as_cluster(store, second)

    assert eventually_refused(lambda: old.list_objects_v2(Bucket=BUCKET, Prefix="clusters/volt-t1-103/")) \
        == "InvalidAccessKeyId"  # fmt: skip
    new.put_object(Bucket=BUCKET, Key="clusters/volt-t1-103/x", Body=b"x")
    assert "volt-t1-c103" in store.identities()

    assert store.revoke("volt-t1-c103") is True
    assert eventually_refused(lambda: new.get_object(Bucket=BUCKET, Key="clusters/volt-t1-103/x")) \
        == "InvalidAccessKeyId"  # fmt: skip
    assert "volt-t1-c103" not in store.identities()
    assert store.revoke("volt-t1-c103") is False  # again: nothing to do


def test_a_grant_whose_key_the_store_never_takes_leaves_no_identity_behind(store, monkeypatch):
    real_client = object_store.Store.client

    def client(self, service="s3", access_key=None, secret_key=None):
        made = real_client(self, service, access_key, secret_key)
        if access_key:  # the new identity's own client: the store never learns its key

            def refuse(**kwargs):
                raise ClientError(
                    {"Error": {"Code": "InvalidAccessKeyId", "Message": "unknown key"}}, "ListObjectsV2"
                )

            made.meta.events.register("before-call.s3.ListObjectsV2", refuse)
        return made

    monkeypatch.setattr(object_store.Store, "client", client)
    monkeypatch.setattr(object_store, "EFFECTIVE_TIMEOUT_S", 1.0)
    with pytest.raises(
        object_store.StoreUnavailable, match="did not take a new key in 1 s: .*InvalidAccessKeyId"
    ):
        store.grant("volt-test-never", "tests/volt-test-never/")
    assert "volt-test-never" not in store.identities()  # no user, policy or key left half-made


def test_a_wrong_admin_key_or_a_store_that_does_not_answer_is_said_so(store):
    wrong = object_store.Store(store.endpoint, "us-east-1", store.access_key, "not-it", BUCKET)
    with pytest.raises(object_store.StoreUnavailable, match="refused Volt's key .*VOLT_STORE_ACCESS_KEY"):
        wrong.grant("volt-t1-c104", "clusters/volt-t1-104/")
    closed = object_store.Store("http://127.0.0.1:9", "us-east-1", "k", "s", BUCKET)
    with pytest.raises(object_store.StoreUnavailable, match="did not answer"):
        closed.list_buckets()


@pytest.mark.parametrize(
    "name, prefix", [("volt c1", "c1/"), ("ok", "/abs/"), ("ok", "no-slash"), ("ok", "")]
)
def test_an_identity_or_prefix_the_store_could_misread_is_refused(store, name, prefix):
    with pytest.raises(ValueError, match="a user name and a 'folder/' prefix"):
        store.grant(name, prefix)
