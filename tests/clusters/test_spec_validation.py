"""Issue 9 point 11: a spec that can never be met is refused (400 naming the field and the known values),
and wrong JSON types are refused rather than coerced."""

import pytest

from clusters.models import Cluster
from tests.clusters.conftest import spec

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("overrides", "field", "words"),
    [
        ({"regions": ["mars-1"]}, "regions", ["unknown region 'mars-1'", "us-east"]),
        ({"regions": ["us-east", "mars-1"]}, "regions", ["'mars-1'"]),
        ({"gpu_models": ["H900"]}, "gpu_models", ["unknown GPU model 'H900'", "offers H100"]),
        (
            {"interconnect": ["roce"], "interconnect_mode": "required"},
            "interconnect",
            ["required interconnect roce", "ib_ndr"],
        ),
    ],
)
def test_spec_that_can_never_be_met_is_refused(alice, rack, client_for, overrides, field, words):
    client = client_for(alice)
    for url in ("/api/v1/clusters/", "/api/v1/placements/preview"):
        response = client.post(url, spec(**overrides), format="json")
        assert response.status_code == 400, response.json()
        messages = " ".join(response.json()["error"]["fields"][field])
        assert all(w in messages for w in words), messages
    assert not Cluster.objects.exists()


def test_region_that_exists_is_accepted(alice, rack, client_for):
    response = client_for(alice).post("/api/v1/placements/preview", spec(regions=["us-east"]), format="json")
    assert response.status_code == 200 and response.json()["placed"]


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"regions": [1, 2]}, "regions"),
        ({"gpu_models": [100]}, "gpu_models"),
        ({"nodes": "2"}, "nodes"),
        ({"nodes": 2.5}, "nodes"),
        ({"gpus_per_node": True}, "gpus_per_node"),
        ({"name": 7}, "name"),
    ],
)
def test_wrong_json_types_are_400_not_coerced(alice, rack, client_for, overrides, field):
    response = client_for(alice).post("/api/v1/clusters/", spec(**overrides), format="json")
    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]
    assert not Cluster.objects.exists()
