"""graft-ulysses on one process: the config section, the settings and models it refuses with a
clear ConfigError, and that outside a split forward its attention is the original, bit for bit
(sp_size=1 installs nothing at all)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import graft_ulysses.plugin as plugin
from graft.config import compose
from graft.errors import ConfigError
from graft.models import build_model
from graft.models.family import ModelFamily
from graft_ulysses.attention import PREFIX, replicate_kv_heads, segment_ids, uninstall
from graft_ulysses.checks import check_family, check_full_attention, check_heads


def test_sp_size_is_a_bounded_setting() -> None:
    assert compose([]).features.ulysses.sp_size == 1
    with pytest.raises(ConfigError, match="sp_size"):
        compose(["features.ulysses.sp_size=0"])


def test_hook_sizes_sp_only_when_asked() -> None:
    assert plugin.graft_parallel_dims(cfg=compose([])) is None
    assert plugin.graft_parallel_dims(cfg=compose(["features.ulysses.sp_size=2"])) == {"sp": 2}


@pytest.mark.parametrize(("overrides", "says"), [
    (["features.multiturn.environment=calculator"], "features.multiturn.environment='calculator'"),
    (["model.preset=tiny-gpt-oss", "engine.ep_size=2"], "engine.ep_size=2"),
    (["features.exact.enabled=true"], "features.exact.enabled=true"),  # graft-exact's
])
def test_settings_it_cannot_serve_are_config_errors(overrides: list[str], says: str) -> None:
    cfg = compose(["features.ulysses.sp_size=2", *overrides])
    with pytest.raises(ConfigError, match=says):
        plugin.graft_parallel_dims(cfg=cfg)


def config(**fields: int) -> SimpleNamespace:
    return SimpleNamespace(**fields)


def test_sp_must_divide_the_heads_and_fit_the_kv_heads() -> None:
    check_heads(config(num_attention_heads=8, num_key_value_heads=2), 2)
    check_heads(config(num_attention_heads=8, num_key_value_heads=2), 8)  # kv repeated
    with pytest.raises(ConfigError, match="must divide the model's 8 attention heads"):
        check_heads(config(num_attention_heads=8, num_key_value_heads=8), 3)
    with pytest.raises(ConfigError, match="6 KV heads"):
        check_heads(config(num_attention_heads=12, num_key_value_heads=6), 4)


def test_families_and_windows_it_cannot_serve_are_config_errors() -> None:
    check_family(ModelFamily("llama"), 2)
    check_family(ModelFamily("mine", extras={"ulysses": True}), 2)
    with pytest.raises(ConfigError, match="'gpt_oss' is not served"):
        check_family(ModelFamily("gpt_oss"), 2)
    from transformers import MistralConfig

    with pytest.raises(ConfigError, match="sliding-window"):
        check_full_attention(MistralConfig(sliding_window=64), 2)


def test_pre_shard_refuses_an_attention_it_cannot_mask() -> None:
    cfg = compose(["model.preset=tiny-llama", "features.ulysses.sp_size=2",
                   "model.attn_implementation=flex_attention"])
    model, _ = build_model(cfg.model, seed=0)
    with pytest.raises(ConfigError, match="flex_attention"):
        plugin.graft_pre_shard(model=model, cfg=cfg)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_outside_a_split_forward_the_attention_is_the_original(attention: str) -> None:
    plain_cfg = compose(["model.preset=tiny-llama", f"model.attn_implementation={attention}"])
    model, _ = build_model(plain_cfg.model, seed=0)
    ids = torch.randint(3, 100, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0  # left padding: the original mask function must still run
    expected = model(input_ids=ids, attention_mask=mask).logits
    plugin.graft_pre_shard(model=model, cfg=compose(["model.preset=tiny-llama",
                                                     "features.ulysses.sp_size=2"]))
    assert model.config._attn_implementation == f"{PREFIX}{attention}"
    assert torch.equal(model(input_ids=ids, attention_mask=mask).logits, expected)
    uninstall(model)
    assert model.config._attn_implementation == attention


def test_sp_size_1_leaves_the_model_alone() -> None:
    cfg = compose(["model.preset=tiny-llama"])
    model, _ = build_model(cfg.model, seed=0)
    before = model.config._attn_implementation
    plugin.graft_pre_shard(model=model, cfg=cfg)
    assert model.config._attn_implementation == before


def test_kv_heads_fewer_than_sp_are_repeated_in_order() -> None:
    kv = torch.arange(2.0).reshape(1, 2, 1, 1)
    assert replicate_kv_heads(kv, 4).flatten().tolist() == [0.0, 0.0, 1.0, 1.0]
    assert replicate_kv_heads(kv, 2) is kv


def test_packed_segments_follow_transformers_rule() -> None:
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    assert segment_ids(positions).tolist() == [[1, 1, 1, 2, 2, 3, 3, 3, 3]]
