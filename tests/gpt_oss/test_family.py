"""graft-gpt-oss's family: plugin conformance, the preset's conformance, expert parallelism,
packed masks on every supported transformers."""

from __future__ import annotations

from graft.models import family_for
from graft.testing import check_installed_plugin
from graft.testing.families import check_family_preset
from graft_gpt_oss.parallel import parallelize_gpt_oss


def test_the_installed_plugin_passes_graft_testing() -> None:
    hooks = check_installed_plugin("gpt_oss")
    assert {"graft_model_families", "graft_export_slots"} <= set(hooks)


def test_tiny_preset_passes_the_family_conformance_check() -> None:
    check_family_preset("tiny-gpt-oss", num_routers=2)


def test_the_family_implements_expert_parallelism() -> None:
    family = family_for("gpt_oss")
    assert family.expert_parallel and family.parallelize is parallelize_gpt_oss


def test_packed_masks_name_the_cache_as_the_installed_transformers_does() -> None:
    import warnings

    import torch
    import transformers
    from packaging.version import Version
    from transformers.masking_utils import create_causal_mask

    from graft.models import preset_config
    from graft_gpt_oss.family import mask_cache_keyword, packed_masks

    renamed = Version(transformers.__version__).release >= (5, 24)
    assert mask_cache_keyword(create_causal_mask) == ("cache" if renamed else "past_key_values")
    config = preset_config("gpt_oss", {}, sliding_window=2)
    config._attn_implementation = "sdpa"
    position_ids = torch.tensor([[0, 1, 2, 0, 1]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a deprecated argument name warns
        masks = packed_masks(config, position_ids, torch.float32)
    causal = torch.block_diag(torch.ones(3, 3), torch.ones(2, 2)).tril().bool()  # two rows packed
    window = causal & ~torch.ones(5, 5, dtype=torch.bool).tril(-2)  # the last 2 positions only
    assert torch.equal(masks["full_attention"][0, 0], causal)
    assert torch.equal(masks["sliding_attention"][0, 0], window)
