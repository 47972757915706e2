"""Issue 9.13: a cluster's SSH key is for its team's members only, and every download is audited."""

import asyncssh
import pytest

from clusters.choices import ClusterStatus
from clusters.models import Cluster, ClusterNode
from voltweb import crypto

pytestmark = pytest.mark.django_db


@pytest.fixture
def key_text():
    return asyncssh.generate_private_key("ssh-ed25519").export_private_key("openssh").decode()


@pytest.fixture
def ready_cluster(alice, team_a, key_text):
    return Cluster.objects.create(
        team=team_a,
        created_by=alice,
        name="train",
        spec={},
        status=ClusterStatus.READY,
        ssh_private_key_encrypted=crypto.encrypt(key_text),
        ray_address="127.0.0.11:6380",
        dashboard_url="http://127.0.0.11:8265",
        storage_path="/tmp/volt/storage",
    )


def test_a_team_member_downloads_the_key_and_the_timeline_records_it(
    alice, ready_cluster, key_text, client_for
):
    client = client_for(alice)

    response = client.get(f"/api/v1/clusters/{ready_cluster.pk}/ssh-key/")

    assert response.status_code == 200 and response.content.decode() == key_text
    events = client.get(f"/api/v1/clusters/{ready_cluster.pk}/events/").json()["results"]
    audit = events[-1]
    assert audit["message"] == "SSH private key downloaded by alice" and audit["actor"] == "alice"
    assert audit["at"] and audit["to_status"] == ""


def test_a_platform_admin_sees_the_cluster_but_not_its_key(root, ready_cluster, client_for):
    client = client_for(root)
    assert client.get(f"/api/v1/clusters/{ready_cluster.pk}/").status_code == 200

    response = client.get(f"/api/v1/clusters/{ready_cluster.pk}/ssh-key/")

    assert response.status_code == 403
    error = response.json()["error"]
    assert error["code"] == "team_members_only" and "Lab A" in error["message"]
    assert not ready_cluster.events.filter(actor=root).exists()


def test_another_team_gets_404(bob, ready_cluster, client_for):
    assert client_for(bob).get(f"/api/v1/clusters/{ready_cluster.pk}/ssh-key/").status_code == 404


def test_the_cluster_page_offers_the_key_to_members_only_and_shows_downloads(
    client, alice, root, ready_cluster, client_for, northwind_ib, make_host
):
    # The key is offered beside the SSH command, so the cluster's head is on an SSH host.
    head = make_host(northwind_ib.blocks.first())
    ClusterNode.objects.create(cluster=ready_cluster, host=head, rank=0, is_head=True, gpu_indices=[0])
    client_for(alice).get(f"/api/v1/clusters/{ready_cluster.pk}/ssh-key/")

    client.force_login(root)
    admin_page = client.get(f"/clusters/{ready_cluster.pk}/").content.decode()
    client.force_login(alice)
    member_page = client.get(f"/clusters/{ready_cluster.pk}/").content.decode()

    assert "Download SSH key" not in admin_page and "team members only" in admin_page
    assert "Download SSH key" in member_page
    assert "SSH private key downloaded by alice" in admin_page  # the audit line, on the timeline
