"""Inventory built straight in the database (no discovery run) so placement tests stay fast."""

import pytest


@pytest.fixture
def rack(northwind_ib, make_host):
    """Northwind's iad1 InfiniBand fabric: 3 H100 hosts in r01, 2 in r02."""
    r01, r02 = northwind_ib.blocks.order_by("name")
    return {
        "r01": [make_host(r01, price="2.50") for _ in range(3)],
        "r02": [make_host(r02, price="2.40") for _ in range(2)],
    }


def spec(**overrides) -> dict:
    base = {"name": "run", "nodes": 2, "gpus_per_node": 8, "gpu_models": ["H100"]}
    return base | overrides
