"""The tie-stable lightning-indexer top-k: ties go to the lower entry, whatever follows the row."""

from __future__ import annotations

import pytest
import torch

import graft_deepseek_v4.indexer as indexer
from graft.config import ModelConfig
from graft.models import build_model
from graft.testing.families import check_family_preset
from graft_deepseek_v4.indexer import install_stable_indexer_topk, stable_top_k


def test_ties_go_to_the_lower_entry_whatever_the_row_length() -> None:
    scores = torch.tensor([[[0.0, -0.0095, 0.0029, -0.0036, 0.0118, 0.0, 0.0059, 0.0]]])
    position = torch.tensor([[31]])  # 32 tokens, compress rate 4: entries 0..7 are causal
    alone = stable_top_k(scores, position, top_k=4, compress_rate=4)
    padded = torch.cat([scores, torch.full((1, 1, 8), 0.0)], dim=-1)  # entries of the pad
    assert alone.tolist() == [[[4, 6, 2, 0]]]
    assert stable_top_k(padded, position, top_k=4, compress_rate=4).tolist() == alone.tolist()
    # torch.topk's own choice among the tied zeros changes with the row length
    assert padded.masked_fill(torch.arange(16) >= 8, float("-inf")).topk(4).indices.tolist() \
        != scores.topk(4).indices.tolist()


def test_without_ties_the_choice_is_torch_topk_s_and_future_slots_are_invalid() -> None:
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 16, 4, generator=generator)
    positions = torch.arange(16).expand(2, 16)
    chosen = stable_top_k(scores, positions, top_k=3, compress_rate=4)
    for b in range(2):
        for t in range(16):
            causal = (t + 1) // 4
            expected = set(scores[b, t, :causal].topk(min(3, causal)).indices.tolist())
            picked = chosen[b, t].tolist()
            assert set(p for p in picked if p >= 0) == expected
            assert picked.count(-1) == 3 - len(expected)


def test_installed_on_every_indexer_once() -> None:
    model, _ = build_model(ModelConfig(preset="tiny-deepseek-v4"))  # the preset installs it
    assert install_stable_indexer_topk(model) == 0
    indexer = model.model.layers[0].self_attn.compressor.indexer
    assert len(indexer._forward_hooks) == 1 and len(indexer.scorer._forward_hooks) == 1


def test_without_it_padding_a_row_changes_a_sample_s_log_probs(monkeypatch) -> None:
    # the finding behind it: transformers' torch.topk breaks the tied scores by row length
    monkeypatch.setattr(indexer, "install_stable_indexer_topk", lambda model: 0)
    with pytest.raises(AssertionError, match="Tensor-likes are not close"):
        check_family_preset("tiny-deepseek-v4", num_routers=2, seed=3)


def test_a_model_loaded_from_a_checkpoint_gets_it_too(tmp_path) -> None:
    from graft.models.build import build_empty_model

    model, _ = build_model(ModelConfig(preset="tiny-deepseek-v4"))
    model.save_pretrained(tmp_path)
    for loaded in (build_model(ModelConfig(path=str(tmp_path)))[0],
                   build_empty_model(ModelConfig(path=str(tmp_path)))[0]):
        assert install_stable_indexer_topk(loaded) == 0, "already installed by the family"
