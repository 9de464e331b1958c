"""``engine.checkpoint_every_blocks`` (checkpoints of several blocks), through the core's
`parallelize` (FSDP2 on one gloo rank): the same log-probs and gradients as per-block
checkpointing on every preset family (bit for bit), one saved input per group, each block
replayed once, and the setting's errors. (With the tiled MLP of graft-activation-memory:
tests/activation_memory/test_tiled_mlp.py.)"""

from __future__ import annotations

import pytest
import torch

from graft.config import compose
from graft.engine.distributed.env import init_distributed
from graft.engine.distributed.parallelize import parallelize
from graft.errors import ConfigError
from graft.models.build import build_model
from graft.models.registry import model_families
from graft.testing.families import parallelized_step as step

PRESETS = sorted(name for family in model_families().values() for name in family.presets)
CUSTOM_PARALLELIZE = {name for family in model_families().values() if family.parallelize
                      for name in family.presets}


@pytest.mark.parametrize("preset", sorted(set(PRESETS) - CUSTOM_PARALLELIZE))
def test_checkpoint_groups_keep_logprobs_and_gradients(preset: str) -> None:
    """(A family with its own parallelize checkpoints block by block:
    test_groups_need_the_family_to_pass_them.)"""
    reference = step(preset)
    grouped = step(preset, "engine.checkpoint_every_blocks=2")
    assert torch.equal(grouped[0], reference[0])  # the same operations in the same order
    assert all(torch.equal(grouped[1][n], g) for n, g in reference[1].items()), preset


def test_groups_need_activation_checkpointing() -> None:
    env = init_distributed(device_preference="cpu")
    cfg = compose(["model.preset=tiny-llama", "engine.device=cpu",
                   "engine.checkpoint_every_blocks=2"])
    model, family = build_model(cfg.model, seed=0)
    with pytest.raises(ConfigError, match="engine.activation_checkpointing=true"):
        parallelize(model, family, cfg=cfg, mesh=env.mesh, device=env.device)


@pytest.mark.skipif(not CUSTOM_PARALLELIZE, reason="no family with its own parallelize installed")
def test_groups_need_the_family_to_pass_them() -> None:
    env = init_distributed(device_preference="cpu")
    preset = sorted(CUSTOM_PARALLELIZE)[0]
    cfg = compose([f"model.preset={preset}", "engine.device=cpu",
                   "engine.activation_checkpointing=true", "engine.checkpoint_every_blocks=2"])
    model, family = build_model(cfg.model, seed=0)
    with pytest.raises(ConfigError, match="engine.checkpoint_every_blocks=1"):
        parallelize(model, family, cfg=cfg, mesh=env.mesh, device=env.device)


def graph_nodes(tensor: torch.Tensor) -> list[str]:
    """The names of every autograd node ``tensor`` depends on."""
    seen, stack, names = set(), [tensor.grad_fn], []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.append(type(node).__name__)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return names


def test_groups_hold_one_input_per_group_and_replay_each_block_once() -> None:
    """Four blocks checkpointed three at a time: two group nodes in the graph, no block's own
    operations in it, each block called once more in backward (the group's replay), and each
    block's operations run a third time there (its own checkpoint's recompute: a group's
    backward holds one block's activations at a time)."""
    env = init_distributed(device_preference="cpu")
    cfg = compose(["model.preset=tiny-llama", "engine.device=cpu", "model.overrides.num_hidden_layers=4",
                   "engine.activation_checkpointing=true", "engine.checkpoint_every_blocks=3"])
    model, family = build_model(cfg.model, seed=0)
    model = parallelize(model, family, cfg=cfg, mesh=env.mesh, device=env.device).train()
    calls: list[int] = []
    projections: list[int] = []
    for index, block in enumerate(family.decoder_blocks(model)):
        block.register_forward_pre_hook(lambda module, args, i=index: calls.append(i))
        block.self_attn.q_proj.register_forward_pre_hook(
            lambda module, args, i=index: projections.append(i))
    ids = torch.randint(3, 100, (1, 20), generator=torch.Generator().manual_seed(0))
    logits = model(input_ids=ids, use_cache=False).logits
    names = graph_nodes(logits)
    assert names.count("_GroupCheckpointBackward") == 2
    assert names.count("MmBackward0") == 1  # the head's: the blocks' live only in the replays
    logits.sum().backward()
    assert calls == [0, 1, 2, 3, 3, 0, 1, 2]
    # forward; group 3: replay, recompute; group 0-2: replay of all three, then each
    # block's recompute as the backward reaches it (last block first)
    assert projections == [0, 1, 2, 3, 3, 3, 0, 1, 2, 2, 1, 0]
