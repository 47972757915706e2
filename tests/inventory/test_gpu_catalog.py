"""GPU variants that matter for a job, and the one matching rule offers and placement share."""

import pytest

from inventory.gpu_catalog import canonical_model, matching_models, model_matches


@pytest.mark.parametrize(
    ("smi_name", "memory_mib", "model"),
    [
        ("NVIDIA A100-SXM4-80GB", 81920, "A100-80GB"),
        ("NVIDIA A100-SXM4-40GB", 40960, "A100-40GB"),
        ("NVIDIA A100-PCIE-40GB", 40960, "A100-40GB"),
        ("NVIDIA A100 80GB PCIe", 81920, "A100-80GB"),
        ("NVIDIA A100 PCIe", 40960, "A100-40GB"),  # the size only in memory.total
        ("NVIDIA H100 80GB HBM3", 81559, "H100-SXM"),
        ("NVIDIA H100 PCIe", 81559, "H100-PCIe"),
        ("NVIDIA H100 NVL", 95830, "H100-NVL"),
        ("NVIDIA H200", 143771, "H200"),
        ("NVIDIA GeForce RTX 4090", 24564, "RTX 4090"),
        ("NVIDIA  GeForce RTX 3090 ", 24576, "RTX 3090"),  # unknown: a normalised name
        ("NVIDIA RTX A6000", 49140, "RTX A6000"),
        ("Tesla V100-SXM2-32GB", 32768, "V100-SXM2-32GB"),
    ],
)
def test_nvidia_smi_names_map_to_precise_models(smi_name, memory_mib, model):
    assert canonical_model(smi_name, memory_mib) == model


def test_a_family_matches_every_variant_and_a_variant_only_itself():
    assert model_matches("A100", "A100-40GB") and model_matches("A100", "A100-80GB")
    assert model_matches("a100-80gb", "A100-80GB") and not model_matches("A100-80GB", "A100-40GB")
    assert all(model_matches("H100", m) for m in ("H100-SXM", "H100-PCIe", "H100-NVL"))
    assert not model_matches("H100-SXM", "H100-NVL") and not model_matches("H100", "H200")
    assert model_matches("rtx 4090", "RTX 4090") and not model_matches("RTX", "RTX 4090")


def test_matching_models_keeps_request_order_and_unknown_names():
    offered = ["A100-40GB", "A100-80GB", "H100-SXM", "L40S"]

    assert matching_models(["H100", "A100"], offered) == ("H100-SXM", "A100-40GB", "A100-80GB")
    assert matching_models(["A100-80GB", "A100"], offered) == ("A100-80GB", "A100-40GB")
    assert matching_models(["B200"], offered) == ("B200",)
