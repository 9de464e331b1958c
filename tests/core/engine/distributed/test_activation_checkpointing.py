"""``engine.activation_checkpointing`` and ``engine.compile`` do what they say on the installed
transformers (the checkpoint lives in the layer's ``__call__`` up to 5.22, in its ``forward``
from 5.23, where a compiled block compiles it too): the backward recomputes every block, a
compiled block runs compiled in both passes, and neither changes the gradients."""

from __future__ import annotations

import collections
import warnings

import pytest
import torch
from torch.profiler import profile

from graft.config import compose
from graft.engine.distributed.env import init_distributed
from graft.engine.distributed.parallelize import parallelize
from graft.models.build import build_model

MATMUL = "aten::mm"
COMPILED_FORWARD = "Torch-Compiled Region"  # the profiler's label of a compiled frame's run
COMPILED_BACKWARD = "CompiledFunctionBackward"


def step(*, checkpointing: bool, compiled: bool) -> dict:
    """One forward and backward of tiny-llama through the core's `parallelize`: op counts of each
    pass (a second step's, after compilation), the number of blocks and linears, the gradients."""
    torch._dynamo.reset()
    env = init_distributed(device_preference="cpu")
    cfg = compose(["model.preset=tiny-llama", "engine.device=cpu",
                   f"engine.activation_checkpointing={checkpointing}",
                   f"engine.compile={compiled}"])
    model, family = build_model(cfg.model, seed=0)
    with warnings.catch_warnings():  # the deprecated enable (transformers >= 5.23) warns
        warnings.simplefilter("error", FutureWarning)
        model = parallelize(model, family, cfg=cfg, mesh=env.mesh, device=env.device)
    blocks = family.decoder_blocks(model)
    model.train()
    ids = torch.randint(0, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        with profile() as forward:
            loss = model(input_ids=ids, use_cache=False).logits.float().logsumexp(-1).mean()
        with profile() as backward:
            loss.backward()
    return {"forward": _counts(forward), "backward": _counts(backward), "blocks": len(blocks),
            "linears": sum(isinstance(m, torch.nn.Linear) for m in blocks[0].modules()),
            "grads": {n: p.grad.full_tensor().clone() for n, p in model.named_parameters()}}


def _counts(prof: profile) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    for event in prof.key_averages():
        for label in (MATMUL, COMPILED_FORWARD, COMPILED_BACKWARD):
            if event.key.startswith(label):
                counts[label] += event.count
    return counts


def recomputed_matmuls(checkpointed: dict, plain: dict) -> int:
    return checkpointed["backward"][MATMUL] - plain["backward"][MATMUL]


def test_checkpointing_recomputes_every_block_in_backward_with_the_same_gradients() -> None:
    plain = step(checkpointing=False, compiled=False)
    checkpointed = step(checkpointing=True, compiled=False)
    # eager recompute reruns each block's forward whole: every linear again
    assert recomputed_matmuls(checkpointed, plain) == checkpointed["blocks"] * checkpointed["linears"]
    for name, grad in plain["grads"].items():
        assert torch.equal(checkpointed["grads"][name], grad), name


@pytest.mark.slow
def test_compiled_blocks_are_checkpointed_and_run_compiled_in_both_passes() -> None:
    eager = step(checkpointing=True, compiled=False)
    plain = step(checkpointing=False, compiled=True)
    both = step(checkpointing=True, compiled=True)
    blocks = both["blocks"]
    for run in (plain, both):
        assert run["forward"][COMPILED_FORWARD] == blocks
        assert run["backward"][COMPILED_BACKWARD] == blocks
    # recomputed: every linear whose output the backward needs, all but the block's last (the
    # compiled backward may leave that one out; eager recompute runs it too)
    assert recomputed_matmuls(both, plain) >= blocks * (both["linears"] - 1)
    for name, grad in eager["grads"].items():
        torch.testing.assert_close(both["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)
