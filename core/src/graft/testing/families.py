"""`check_family_preset`: the conformance check a model family's preset must pass; and
`parallelized_step`, one training step's log-probs and gradients through the core's
`parallelize`, for a ``graft_pre_shard`` plugin's tests (the same results with it as without).

What the engine relies on, checked on the preset's tiny model: seeded builds are identical,
``decoder_blocks`` lists every layer, packed rows give the same log-probs and gradients as each
sample alone (for families that pack), and every router's weights are reproduced by the family's
``routing_weights`` from its logits and chosen experts.
"""

from __future__ import annotations

from typing import Any

import torch

from graft.config import ModelConfig
from graft.engine.batch.micro_batch import TokenSample, build_micro_batch
from graft.engine.forward import forward_logprobs
from graft.models import build_model

LENGTHS = (23, 9, 31, 14)


def _samples(seed: int) -> list[TokenSample]:
    generator = torch.Generator().manual_seed(seed)
    return [TokenSample([1, *torch.randint(3, 100, (n,), generator=generator).tolist()], 4)
            for n in LENGTHS]


def _logprobs_and_grads(model: torch.nn.Module, family: Any, samples: list[TokenSample],
                        pad_bucket: int | None = None, max_row_tokens: int | None = None
                        ) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    model.zero_grad()
    batch = build_micro_batch(samples, packs_sequences=family.packs_sequences, pad_token_id=0,
                              pad_bucket=pad_bucket, max_row_tokens=max_row_tokens)
    logp, _ = forward_logprobs(model, family, batch, compute_dtype=torch.float32)
    (logp * batch.tensors["loss_mask"]).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return batch.layout.unpad(logp.detach()), grads


def check_packing(model: torch.nn.Module, family: Any, *, max_row_tokens: int | None = None) -> None:
    """A micro-batch of several samples (padded to a bucket; in rows of at most
    ``max_row_tokens`` when given) gives each sample's log-probs and the sum of their gradients,
    as when each runs alone."""
    samples = _samples(0)
    together, grads = _logprobs_and_grads(model, family, samples, pad_bucket=64,
                                          max_row_tokens=max_row_tokens)
    alone_grads: dict[str, torch.Tensor] = {}
    for index, sample in enumerate(samples):
        (alone,), sample_grads = _logprobs_and_grads(model, family, [sample])
        torch.testing.assert_close(together[index], alone, rtol=1e-5, atol=1e-5)
        for name, grad in sample_grads.items():
            alone_grads[name] = alone_grads.get(name, 0) + grad
    assert grads.keys() == alone_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, alone_grads[name], rtol=1e-4, atol=1e-5, msg=name)


def check_routers(model: torch.nn.Module, family: Any) -> None:
    """Every router returns ``(logits, weights, ids)`` and ``family.routing_weights``
    reproduces its weights exactly from its logits and ids."""
    inputs = torch.randn(7, model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    for router in family.router_modules(model):
        with torch.no_grad():
            router.weight.normal_(generator=torch.Generator().manual_seed(2))
        extra = {"input_ids": torch.arange(7)} if "input_ids" in _parameters(router) else {}
        logits, weights, ids = router(inputs, **extra)
        assert torch.equal(family.routing_weights(router, logits, ids), weights), type(router)


def _parameters(module: torch.nn.Module) -> list[str]:
    import inspect

    return list(inspect.signature(module.forward).parameters)


def check_family_preset(preset: str, *, num_routers: int | None = None, seed: int = 3) -> None:
    """Run every check on ``preset`` (fp32, CPU) built from ``seed``; ``num_routers``: the MoE
    layers expected."""
    model, family = build_model(ModelConfig(preset=preset), seed=seed)
    again, _ = build_model(ModelConfig(preset=preset), seed=seed)
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items(),
                                 strict=True):
        assert torch.equal(a, b), f"{preset}: {name} differs between two seeded builds"
    assert model.config.model_type == family.model_type
    assert len(family.decoder_blocks(model)) == model.config.num_hidden_layers
    check_packing(model, family)
    if num_routers is not None:
        assert family.router_modules is not None
        assert len(family.router_modules(model)) == num_routers
        if family.routing_weights is not None:
            check_routers(model, family)


def parallelized_step(preset: str, *overrides: str
                      ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Log-probs and full (unsharded) gradients of one forward + backward of a packed
    micro-batch of two samples (45 and 30 tokens), fp32 on the CPU, on ``preset``'s model
    (seed 0) built and parallelized as a run does (activation checkpointing, FSDP2 over the
    process's data-parallel mesh, the ``graft_pre_shard`` plugins) with the config
    ``overrides``. The loss is the log-probs weighted by seeded random weights."""
    from graft.config import compose
    from graft.engine.distributed.env import init_distributed
    from graft.engine.distributed.parallelize import parallelize

    env = init_distributed(device_preference="cpu")
    cfg = compose([f"model.preset={preset}", "engine.device=cpu",
                   "engine.activation_checkpointing=true", *overrides])
    model, family = build_model(cfg.model, seed=0)
    model = parallelize(model.float(), family, cfg=cfg, mesh=env.mesh, device=env.device).train()
    generator = torch.Generator().manual_seed(1)
    samples = [TokenSample([1, *torch.randint(3, 100, (n,), generator=generator).tolist()], 3)
               for n in (45, 30)]
    batch = build_micro_batch(samples, packs_sequences=family.packs_sequences, pad_token_id=0)
    logp, _ = forward_logprobs(model, family, batch, compute_dtype=torch.float32,
                               chunk_tokens=cfg.engine.logprob_chunk_tokens)
    weights = torch.randn(logp.shape, generator=generator) * batch.tensors["loss_mask"]
    (logp * weights).sum().backward()
    return logp.detach(), {n: p.grad.full_tensor().clone() for n, p in model.named_parameters()
                           if p.grad is not None}


EXPORT_BATCH = [[1, 70, 83, 84, 93, 4, 69, 70, 71, 30], [1, 21, 22, 15, 23, 33, 40, 41, 42, 43]]


def check_hf_export(run_dir: Any, preset: str, step: int) -> None:
    """``<run_dir>/hf`` loads in transformers with no missing or unexpected keys and computes
    exactly (fp32) the logits of the checkpoint ``step`` of that run, loaded into ``preset``."""
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    from graft.checkpoint.reader import load_tensors

    run_dir = Path(run_dir)
    exported, info = AutoModelForCausalLM.from_pretrained(run_dir / "hf", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    reference, _ = build_model(ModelConfig(preset=preset))
    missing, unexpected = reference.load_state_dict(
        load_tensors(run_dir / "checkpoints" / f"step_{step}"), strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    batch = torch.tensor(EXPORT_BATCH)
    with torch.no_grad():
        expected = reference.eval()(batch, use_cache=False).logits
        got = exported.eval()(batch, use_cache=False).logits
    assert got.dtype == torch.float32
    assert torch.equal(got, expected)
