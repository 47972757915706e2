"""Issue 21 point 3g: collection answers match the OpenAPI schema (as schemathesis would check them).

`GET /api/v1/clusters/{id}/drills/` answered a plain list where the schema promised a paginated page.
Each answer here is validated against the schema's own response for its operation.
"""

from __future__ import annotations

import jsonschema
import pytest
from drf_spectacular.generators import SchemaGenerator

from clusters.models import Cluster

pytestmark = pytest.mark.django_db


def _as_json_schema(node):
    """OpenAPI 3.0's `nullable: true` as JSON Schema's `type: [T, "null"]` (jsonschema knows no nullable)."""
    if isinstance(node, list):
        return [_as_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _as_json_schema(value) for key, value in node.items() if key != "nullable"}
    if node.get("nullable") and "type" in node:
        out["type"] = [node["type"], "null"]
    elif node.get("nullable"):
        out = {"anyOf": [out, {"type": "null"}]}
    return out


def response_schema(path: str, method: str = "get", status: str = "200") -> dict:
    schema = SchemaGenerator().get_schema(request=None, public=True)
    answer = schema["paths"][path][method]["responses"][status]["content"]["application/json"]["schema"]
    return _as_json_schema({**answer, "components": schema["components"]})


def test_the_drill_list_is_the_paginated_page_the_schema_says(root, alice, team_a, client_for):
    cluster = Cluster.objects.create(team=team_a, created_by=alice, name="a1", status="ready",
                                     spec={"nodes": 1, "gpus_per_node": 1, "gpu_models": ["H100"]})  # fmt: skip

    response = client_for(root).get(f"/api/v1/clusters/{cluster.pk}/drills/")

    assert response.status_code == 200
    jsonschema.validate(response.json(), response_schema("/api/v1/clusters/{id}/drills/"))
    page = response.json()
    assert page["count"] == len(page["results"]) >= 7 and page["next"] is None
    assert {"drill": "kill_processes", "description": page["results"][0]["description"], "value": None} in (
        page["results"]
    )
