"""Issue 9 point 10: errors tell one tenant nothing about another's objects. Uniqueness is per provider,
and "exists, not yours" answers exactly like "does not exist"."""

from __future__ import annotations

import pytest

from inventory.choices import FabricKind

pytestmark = pytest.mark.django_db

SSH_HOST = {
    "driver": "ssh",
    "address": "10.20.30.40",
    "ssh_port": 22,
    "ssh_user": "volt",
    "price_per_gpu_hour": "2",
}


def add_ssh_host(client, provider_slug: str, block_id: int, name: str):
    body = SSH_HOST | {"provider": provider_slug, "name": name, "block": block_id}
    return client.post("/api/v1/hosts/", body, format="json")


def test_host_address_is_unique_per_provider_only(priya, omar, northwind_ib, helios_roce, client_for):
    assert (
        add_ssh_host(client_for(priya), "northwind", northwind_ib.blocks.first().pk, "n1").status_code == 202
    )
    # Helios claims the same address: it must not learn that Northwind has a host there.
    response = add_ssh_host(client_for(omar), "helios", helios_roce.blocks.first().pk, "h1")
    assert response.status_code == 202, response.json()
    # Northwind itself is told about its own duplicate, on the address field.
    response = add_ssh_host(client_for(priya), "northwind", northwind_ib.blocks.first().pk, "n2")
    assert response.status_code == 400
    assert response.json()["error"]["fields"]["address"] == ["You already have a host at 10.20.30.40:22."]


def test_fabric_names_are_per_provider(omar, helios, northwind_ib, iad1, client_for):
    body = {"provider": "helios", "site": iad1.pk, "name": northwind_ib.name, "kind": FabricKind.ROCE}
    response = client_for(omar).post("/api/v1/fabrics/", body | {"block_names": ["x1"]}, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["blocks"] == ["x1"]
    northwind_ib.refresh_from_db()
    assert sorted(northwind_ib.blocks.values_list("name", flat=True)) == ["r01", "r02"]


def _same_answer(first, second, secret: str, unknown: str):
    assert first.status_code == second.status_code
    assert first.content.decode().replace(secret, "X") == second.content.decode().replace(unknown, "X")


def test_another_providers_slug_answers_like_a_missing_one(
    omar, helios, northwind, northwind_ib, iad1, client_for
):
    client = client_for(omar)
    fabric = {"site": iad1.pk, "name": "f", "kind": FabricKind.ROCE}
    theirs = client.post("/api/v1/fabrics/", fabric | {"provider": "northwind"}, format="json")
    missing = client.post("/api/v1/fabrics/", fabric | {"provider": "nowhere"}, format="json")
    assert theirs.status_code == 400
    _same_answer(theirs, missing, "northwind", "nowhere")

    theirs = add_ssh_host(client, "northwind", 999_999, "x")
    missing = add_ssh_host(client, "nowhere", 999_999, "x")
    _same_answer(theirs, missing, "northwind", "nowhere")


def test_another_providers_block_answers_like_a_missing_one(omar, helios, northwind_ib, client_for):
    client = client_for(omar)
    theirs_id = northwind_ib.blocks.first().pk
    theirs = add_ssh_host(client, "helios", theirs_id, "x")
    missing = add_ssh_host(client, "helios", 999_999, "x")
    assert theirs.status_code == 400
    _same_answer(theirs, missing, str(theirs_id), "999999")


def test_another_teams_slug_answers_like_a_missing_one(bob, alice, team_a, client_for):
    client = client_for(bob)
    body = {"nodes": 1, "gpus_per_node": 1, "gpu_models": ["H100"]}
    theirs = client.post("/api/v1/clusters/", body | {"team": "lab-a"}, format="json")
    missing = client.post("/api/v1/clusters/", body | {"team": "lab-zz"}, format="json")
    assert theirs.status_code == 400
    assert theirs.json()["error"]["fields"]["team"] == ["No team 'lab-a' among yours."]
    _same_answer(theirs, missing, "lab-a", "lab-zz")
