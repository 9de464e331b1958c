"""``features.activation_memory.mlp_chunk_tokens`` (tiled MLP) and ``recompute_norms``,
installed through ``graft_pre_shard`` by the core's `parallelize` (FSDP2 on one gloo rank): the
same log-probs and gradients as the whole MLP and norms on every preset family (fp32, 1e-6;
recomputed norms' log-probs bit for bit), with the core's checkpoint groups too, and each MLP
recomputed per chunk."""

from __future__ import annotations

import pytest
import torch

from graft.config import compose
from graft.engine.distributed.env import init_distributed
from graft.engine.distributed.parallelize import parallelize
from graft.models.build import build_model
from graft.models.registry import model_families
from graft.testing.families import parallelized_step as step

PRESETS = sorted(name for family in model_families().values() for name in family.presets)
CUSTOM_PARALLELIZE = {name for family in model_families().values() if family.parallelize
                      for name in family.presets}


def assert_close(run, reference, what: str) -> None:
    torch.testing.assert_close(run[0], reference[0], rtol=1e-6, atol=1e-6, msg=what)
    assert run[1].keys() == reference[1].keys()
    for name, grad in run[1].items():
        error = float((grad - reference[1][name]).norm() / reference[1][name].norm().clamp_min(1e-30))
        assert error <= 1e-6, f"{what}: gradient of {name} off by {error:.2e}"


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_tiled_mlp_and_recomputed_norms_keep_logprobs_and_gradients(preset: str) -> None:
    reference = step(preset)
    assert_close(step(preset, "features.activation_memory.mlp_chunk_tokens=16"), reference,
                 f"{preset} tiled MLP")
    # the same forward; in backward a norm's own gradient contributions to its input are summed
    # before they join the residual's (in bf16 the norm's fp32 upcast does that anyway)
    normed = step(preset, "features.activation_memory.recompute_norms=true")
    assert torch.equal(normed[0], reference[0])
    assert_close(normed, reference, f"{preset} recomputed norms")
    if preset in CUSTOM_PARALLELIZE:
        return  # its family checkpoints block by block (tests/core/engine/test_checkpoint_groups.py)
    assert_close(step(preset, "engine.checkpoint_every_blocks=2",
                      "features.activation_memory.mlp_chunk_tokens=7"),
                 reference, f"{preset} both")


def test_each_mlp_chunk_recomputed_in_backward() -> None:
    """Tiled: the MLP's projections run once per chunk in forward and again per chunk in the
    backward's recompute (the checkpoint's replay, then the chunk's own), the biggest
    intermediate being one chunk's."""
    env = init_distributed(device_preference="cpu")
    cfg = compose(["model.preset=tiny-llama", "engine.device=cpu",
                   "engine.activation_checkpointing=true",
                   "features.activation_memory.mlp_chunk_tokens=10"])
    model, family = build_model(cfg.model, seed=0)
    model = parallelize(model, family, cfg=cfg, mesh=env.mesh, device=env.device).train()
    rows: list[int] = []
    handle = family.decoder_blocks(model)[0].mlp.gate_proj.register_forward_hook(
        lambda module, args, out: rows.append(out.shape[0]))
    ids = torch.randint(3, 100, (1, 35), generator=torch.Generator().manual_seed(0))
    loss = model(input_ids=ids, use_cache=False).logits.logsumexp(-1).sum()
    assert rows == [10, 10, 10, 5]
    loss.backward()
    handle.remove()
    assert rows == [10, 10, 10, 5] * 3
