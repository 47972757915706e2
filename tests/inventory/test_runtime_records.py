"""What Volt keeps of each SSH host's runtime (issue 25 item 2; the install itself: tests/lab/test_runtime.py):
a host is offered only once its runtime of Volt's current pins is ready; what is wrong with a runtime is said
in words with the fix; provider admins ask for an install from the API or the host page; when the pins move,
idle hosts are brought up to date and busy ones wait for their cluster's end."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from inventory import host_runtime, runtimes, services
from inventory.models import Host
from tests.clusters.conftest import spec

pytestmark = pytest.mark.django_db


def offered(host: Host) -> bool:
    return services.offerable_hosts().filter(pk=host.pk).exists()


def test_an_ssh_host_is_offered_only_with_a_ready_runtime_of_volts_current_pins(northwind_ib, make_host):
    host = make_host(northwind_ib.blocks.first())
    assert offered(host)  # make_host's hosts have theirs

    for record in (
        {},
        host.runtime | {"ready": False, "state": "failed"},
        host.runtime | {"key": "ray2.0.0-torch2.0.0-py3.11"},
    ):
        Host.objects.filter(pk=host.pk).update(runtime=record)
        assert not offered(host), record
    with pytest.raises(host_runtime.RuntimeProblem) as refused:
        runtimes.python_of(Host.objects.get(pk=host.pk))
    assert f"has no runtime of Volt's pins ({host_runtime.key()})" not in str(refused.value)
    assert "does not match Volt" in str(refused.value) and "Install it again from the host page" in str(
        refused.value
    )


def test_a_runtimes_problems_are_named_against_volts_pins():
    pins = host_runtime.pins()
    good = {"python": host_runtime.python_version(), "versions": dict(pins), "foreign": []}
    assert host_runtime.judge(good) == []
    drifted = good | {
        "versions": pins | {"numpy": "1.26.4", "ray": None},
        "python": "3.10",
        "foreign": ["django"],
    }
    assert host_runtime.judge(drifted) == [
        f"ray missing, Volt pins {pins['ray']}",
        f"numpy 1.26.4, Volt pins {pins['numpy']}",
        f"Python 3.10, Volt runs {host_runtime.python_version()}",
        "it holds django (code on clusters imports no Volt code)",
    ]


def test_a_host_without_volts_python_version_is_told_what_to_install():
    with pytest.raises(host_runtime.RuntimeProblem) as refused:
        host_runtime.base_python({"pythons": [{"path": "/usr/bin/python3", "version": "3.10.12"}]})
    wanted = host_runtime.python_version()
    assert f"the host has no Python {wanted} (found: /usr/bin/python3 (3.10.12))" in str(refused.value)
    assert f"apt-get install python{wanted}" in str(refused.value)
    system = {
        "pythons": [
            {"path": "/usr/bin/python3", "version": "3.10.12"},
            {"path": "/opt/py/bin/python3", "version": f"{wanted}.4"},
        ]
    }
    assert host_runtime.base_python(system) == "/opt/py/bin/python3"
    assert (
        host_runtime.target_path(system | {"privilege": "sudo"}, "/home/volt")
        == f"/opt/volt/runtime-{host_runtime.key()}"
    )
    assert (
        host_runtime.target_path(system | {"privilege": "none"}, "/home/volt")
        == f"/home/volt/.volt/runtime-{host_runtime.key()}"
    )


def test_provider_admins_ask_for_an_install_from_the_api_and_others_cannot(
    northwind_ib, make_host, priya, omar, client_for
):
    host = make_host(northwind_ib.blocks.first())
    assert client_for(omar).post(f"/api/v1/hosts/{host.pk}/runtime/").status_code == 404
    answer = client_for(priya).post(f"/api/v1/hosts/{host.pk}/runtime/")  # the task: on commit, not here
    assert answer.status_code == 202, answer.json()
    assert answer.json()["runtime"]["state"] == "queued"
    assert answer.json()["runtime"]["step"] == "queued by priya"


def test_a_local_host_has_no_runtime_of_its_own_to_install(
    add_local_host, northwind, northwind_ib, priya, client_for
):
    host = add_local_host(northwind, northwind_ib, "local-01")
    answer = client_for(priya).post(f"/api/v1/hosts/{host.pk}/runtime/")
    assert answer.status_code == 409
    assert answer.json()["error"]["code"] == "runtime_refused"
    assert "runs the local runtime of Volt's machine" in answer.json()["error"]["message"]


def test_the_host_page_shows_the_runtime_and_its_failure_with_an_install_button(
    northwind_ib, make_host, priya
):
    host = make_host(northwind_ib.blocks.first())
    client = Client()
    client.force_login(priya)
    page = client.get(f"/inventory/hosts/{host.pk}/").content.decode()
    assert "Volt&#x27;s runtime" in page or "Volt's runtime" in page
    assert f"ray {host_runtime.pins()['ray']}" in page and f"/opt/volt/runtime-{host_runtime.key()}" in page
    assert "Verify Volt" in page

    message = host_runtime.mismatch_message(
        host.name, host.runtime | {"problems": ["numpy 0.0.1, Volt pins 2.4.6"]}
    )
    Host.objects.filter(pk=host.pk).update(
        runtime=host.runtime | {"state": "failed", "ready": False, "message": message}
    )
    page = client.get(f"/inventory/hosts/{host.pk}/").content.decode()
    assert 'id="runtime-error"' in page and "numpy 0.0.1, Volt pins 2.4.6" in page
    assert "Install Volt" in page
    answer = client.post(f"/inventory/hosts/{host.pk}/runtime/", follow=True)
    assert "Volt&#x27;s runtime is being installed" in answer.content.decode()
    assert Host.objects.get(pk=host.pk).runtime["state"] == "queued"


def test_when_volts_pins_move_idle_hosts_are_brought_up_to_date_and_busy_ones_wait(
    northwind_ib, make_host, alice, client_for, committed
):
    block = northwind_ib.blocks.first()
    busy, idle = make_host(block, name="busy-01"), make_host(block, name="idle-01")
    with committed():
        answer = client_for(alice).post("/api/v1/clusters/", spec(nodes=1, gpus_per_node=8), format="json")
    assert answer.status_code == 202, answer.json()
    taken = Host.objects.get(gpus__allocations__active=True, gpus__index=0)
    other = idle if taken.pk == busy.pk else busy
    old = taken.runtime | {"key": "ray2.0.0-torch2.0.0-py3.11"}  # what an older Volt installed
    Host.objects.filter(pk__in=[taken.pk, other.pk]).update(runtime=old)

    assert runtimes.refresh_runtimes() == 1  # the idle one (its task is sent on commit, not here)
    assert Host.objects.get(pk=other.pk).runtime["state"] == "queued"
    assert Host.objects.get(pk=taken.pk).runtime == old

    waited = runtimes.install_runtime(taken.pk)  # a worker that gets to it anyway leaves it alone
    assert waited.runtime["state"] == "waiting"
    assert "when the host's cluster ends" in waited.runtime["step"]


class MarkedHost:
    """A host whose runtime folder holds Volt's marker (the host driver is the seam)."""

    def __init__(self, marker: str):
        self.marker = marker
        self.address = "nw-01"

    def run(self, command, timeout=None):
        from inventory.drivers.base import CommandResult

        report = {
            "python": host_runtime.python_version(),
            "versions": dict(host_runtime.pins()),
            "foreign": [],
        }
        return CommandResult(0, f"@@exists\n{self.marker}\n\n@@report\n{json.dumps(report)}\n", "")


@pytest.mark.parametrize(
    ("marker", "method", "shown"),
    [
        ('{"key": "k", "by": "volt", "how": "image"}', "image", "Volt's runtime image: one squashfs file"),
        ('{"key": "k", "by": "volt", "how": "wheels"}', "wheels", "Volt's wheels, installed with pip"),
        ("", "", None),  # no marker: the provider's own install
    ],
)
def test_the_host_page_says_whether_the_runtime_came_from_the_image_or_the_wheels(
    northwind_ib, make_host, priya, marker, method, shown
):
    found = host_runtime.inspect(MarkedHost(marker), "/opt/volt/runtime-x")
    assert (found.installed_by, found.method) == ("volt" if marker else "provider", method)

    host = make_host(northwind_ib.blocks.first())
    Host.objects.filter(pk=host.pk).update(runtime=host.runtime | {"method": found.method})
    client = Client()
    client.force_login(priya)
    page = client.get(f"/inventory/hosts/{host.pk}/").content.decode().replace("&#x27;", "'")
    if shown:
        assert shown in page
    else:
        assert 'id="runtime-method"' not in page
