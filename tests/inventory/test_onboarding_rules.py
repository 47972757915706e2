"""Issue 9.3: who may onboard which host, and what a host request may contain (400s, not storage)."""

import asyncssh
import pytest

from inventory import services
from inventory.models import Host

pytestmark = pytest.mark.django_db


def ssh_key() -> str:
    return asyncssh.generate_private_key("ssh-ed25519").export_private_key("openssh").decode()


def ssh_body(provider="northwind", block=None, **overrides):
    body = {
        "provider": provider,
        "name": "gpu-07",
        "block": block,
        "driver": "ssh",
        "price_per_gpu_hour": "2.10",
        "address": "gpu-07.example.net",
        "ssh_user": "volt",
        "ssh_private_key": ssh_key(),
    }
    return body | overrides


def local_body(block, **overrides):
    body = {
        "provider": "northwind",
        "name": "sim-01",
        "block": block,
        "driver": "local",
        "price_per_gpu_hour": "0.01",
        "local_spec": {"gpu_model": "H100", "gpu_count": 16},
    }
    return body | overrides


@pytest.fixture
def pending(make_user, iad1):
    owner = make_user("newcomer")
    provider = services.register_provider(owner, "Fresh GPUs")
    fabric = services.create_fabric(provider, iad1, "fresh-eth", "eth_100g", None, 1.0, ["f1"])
    return owner, provider, fabric.blocks.get()


# --- approval ------------------------------------------------------------------------------------


def test_a_pending_provider_cannot_onboard_hosts_through_the_api(pending, client_for):
    owner, provider, block = pending

    response = client_for(owner).post("/api/v1/hosts/", ssh_body(provider.slug, block.pk), format="json")

    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "provider_not_approved" and "approved" in error["message"]
    assert not Host.objects.exists()


def test_a_pending_provider_is_told_in_the_console(pending, client):
    owner, provider, _ = pending
    client.force_login(owner)

    response = client.get(f"/inventory/providers/{provider.slug}/hosts/new/", follow=True)

    assert response.redirect_chain[-1][0] == f"/inventory/providers/{provider.slug}/"
    page = response.content.decode()
    assert "hosts can be onboarded once a platform admin has approved the provider" in page
    assert "Add host</a>" not in page


def test_a_suspended_providers_host_cannot_be_rediscovered(
    priya, northwind, northwind_ib, add_local_host, client_for
):
    host = add_local_host(northwind, northwind_ib, "old")
    services.review_provider(northwind, approve=False)

    response = client_for(priya).post(f"/api/v1/hosts/{host.pk}/rediscover/", {}, format="json")

    assert response.status_code == 409 and response.json()["error"]["code"] == "provider_not_approved"


# --- the local driver ------------------------------------------------------------------------------


def test_local_hosts_are_off_unless_enabled(root, northwind, northwind_ib, client_for, settings):
    settings.VOLT_ALLOW_LOCAL_HOSTS = False

    response = client_for(root).post(
        "/api/v1/hosts/", local_body(northwind_ib.blocks.first().pk), format="json"
    )

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "local_hosts_disabled"
    assert not Host.objects.exists()


def test_local_hosts_are_for_platform_admins(priya, root, northwind, northwind_ib, client_for):
    block = northwind_ib.blocks.first().pk

    refused = client_for(priya).post("/api/v1/hosts/", local_body(block), format="json")
    accepted = client_for(root).post("/api/v1/hosts/", local_body(block), format="json")

    assert refused.status_code == 403 and refused.json()["error"]["code"] == "local_hosts_admins_only"
    assert accepted.status_code == 202


def test_the_console_offers_the_local_driver_only_to_who_may_use_it(
    client, priya, root, northwind, northwind_ib, settings
):
    url = f"/inventory/providers/{northwind.slug}/hosts/new/"
    client.force_login(priya)
    assert [v for v, _ in client.get(url).context["form"].fields["driver"].choices] == ["ssh"]
    client.force_login(root)
    assert "local" in [v for v, _ in client.get(url).context["form"].fields["driver"].choices]
    settings.VOLT_LOCAL_HOSTS_FOR_PROVIDERS = True  # the demo
    client.force_login(priya)
    assert "local" in [v for v, _ in client.get(url).context["form"].fields["driver"].choices]


def test_a_local_host_address_must_be_its_own_loopback(root, northwind, northwind_ib, client_for):
    body = local_body(northwind_ib.blocks.first().pk, address="10.1.2.3")

    response = client_for(root).post("/api/v1/hosts/", body, format="json")

    assert response.status_code == 400 and "address" in response.json()["error"]["fields"]


# --- what a host request may contain ----------------------------------------------------------------


@pytest.mark.parametrize(
    "address",
    [
        "gpu 07",
        "gpu-07;id",
        "$(id).example.net",
        "-oProxyCommand=nc",
        "gpu-07:22",
        "volt@gpu-07",
        "gpu-07\n",
        "`id`",
        "a" * 64 + ".example.net",
        "gpu_07.example.net",
        "1.2.3",
    ],
)
def test_bad_addresses_are_400(address, priya, northwind, northwind_ib, client_for):
    body = ssh_body(block=northwind_ib.blocks.first().pk, address=address)

    response = client_for(priya).post("/api/v1/hosts/", body, format="json")

    assert response.status_code == 400, address
    assert "address" in response.json()["error"]["fields"]


@pytest.mark.parametrize("address", ["gpu-07.example.net", "10.0.0.5", "fe80::1", "GPU7"])
def test_good_addresses_are_accepted(address, priya, northwind, northwind_ib, client_for):
    body = ssh_body(block=northwind_ib.blocks.first().pk, address=address)
    assert client_for(priya).post("/api/v1/hosts/", body, format="json").status_code == 202


@pytest.mark.parametrize("user", ["-oProxyCommand=x", "root;id", "vo lt", "$(id)", "7up", "a" * 33])
def test_bad_ssh_users_are_400(user, priya, northwind, northwind_ib, client_for):
    body = ssh_body(block=northwind_ib.blocks.first().pk, ssh_user=user)

    response = client_for(priya).post("/api/v1/hosts/", body, format="json")

    assert response.status_code == 400 and "ssh_user" in response.json()["error"]["fields"]


def _encrypted_key() -> str:
    key = asyncssh.generate_private_key("ssh-ed25519")
    return key.export_private_key("pkcs8-pem", passphrase="secret").decode()


@pytest.mark.parametrize(
    "key",
    [
        "-----BEGIN OPENSSH PRIVATE KEY-----\nbm90IGEga2V5\n-----END OPENSSH PRIVATE KEY-----",
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB1c5Ui2TYrKbzYQJw4YtX6ZQn2bFqQ2mGq0RkS8h6kE",
        "PRIVATE KEY",
        "encrypted",
    ],
)
def test_keys_are_parsed_not_grepped(key, priya, northwind, northwind_ib, client_for):
    key = _encrypted_key() if key == "encrypted" else key
    body = ssh_body(block=northwind_ib.blocks.first().pk, ssh_private_key=key)

    response = client_for(priya).post("/api/v1/hosts/", body, format="json")

    assert response.status_code == 400 and "ssh_private_key" in response.json()["error"]["fields"]
    assert len(key) < 20 or key not in str(response.json())  # a key is never echoed back


@pytest.mark.parametrize(
    "host_key", ["not a key", "ssh-ed25519 AAAAnotbase64!!", "ssh-ed25519 AAAA\nssh-rsa AAAA"]
)
def test_bad_host_keys_are_400(host_key, priya, northwind, northwind_ib, client_for):
    body = ssh_body(block=northwind_ib.blocks.first().pk, ssh_host_key=host_key)

    response = client_for(priya).post("/api/v1/hosts/", body, format="json")

    assert response.status_code == 400 and "ssh_host_key" in response.json()["error"]["fields"]


@pytest.mark.parametrize(
    "nics",
    [
        [{"name": "mlx5_0; reboot"}],
        [{"name": "mlx5_0", "rate_gbps": "fast"}],
        [{"name": "mlx5_0", "link_layer": "Pigeon"}],
        [{"name": "mlx5_0", "firmware": "x"}],
        [{"name": f"mlx5_{i}"} for i in range(17)],
        [{}],
    ],
)
def test_bad_nic_specs_are_400(nics, root, northwind, northwind_ib, client_for):
    body = local_body(northwind_ib.blocks.first().pk)
    body["local_spec"] = body["local_spec"] | {"nics": nics}

    response = client_for(root).post("/api/v1/hosts/", body, format="json")

    assert response.status_code == 400, response.json()
    assert not Host.objects.exists()


def test_the_console_form_validates_the_same_way(client, priya, northwind, northwind_ib):
    client.force_login(priya)
    form = ssh_body(block=northwind_ib.blocks.first().pk, address="-oProxyCommand=x", ssh_user="root;id")
    form["ssh_private_key"] = "-----BEGIN OPENSSH PRIVATE KEY-----\nx\n-----END OPENSSH PRIVATE KEY-----"
    form["ssh_port"] = "22"

    response = client.post(f"/inventory/providers/{northwind.slug}/hosts/new/", form)

    assert response.status_code == 200
    assert {"address", "ssh_user", "ssh_private_key"} <= set(response.context["form"].errors)
    assert not Host.objects.exists()
