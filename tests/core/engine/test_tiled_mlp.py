"""``engine.mlp_chunk_tokens`` (tiled MLP), ``engine.recompute_norms`` and
``engine.checkpoint_every_blocks`` (checkpoints of several blocks), through the core's
`parallelize` (FSDP2 on one gloo rank): the same log-probs and gradients as per-block
checkpointing on every preset family (fp32, 1e-6; checkpoint groups bit for bit), each MLP recomputed per chunk, a recomputed norm keeping only its input, and the settings'
errors."""

from __future__ import annotations

import pytest
import torch

from graft.config import compose
from graft.engine.distributed import init_distributed
from graft.engine.forward import forward_logprobs
from graft.engine.micro_batch import TokenSample, build_micro_batch
from graft.engine.parallelize import parallelize
from graft.errors import ConfigError
from graft.models.build import build_model
from graft.models.registry import model_families

PRESETS = sorted(name for family in model_families().values() for name in family.presets)
CUSTOM_PARALLELIZE = {name for family in model_families().values() if family.parallelize
                      for name in family.presets}


def step(preset: str, *settings: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Log-probs and gradients of one forward + backward of a packed micro-batch."""
    env = init_distributed(device_preference="cpu")
    cfg = compose([f"model.preset={preset}", "engine.device=cpu",
                   "engine.activation_checkpointing=true", *settings])
    model, family = build_model(cfg.model, seed=0)
    model = parallelize(model.float(), family, cfg=cfg, mesh=env.mesh, device=env.device)
    model.train()
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


def assert_close(run, reference, what: str) -> None:
    torch.testing.assert_close(run[0], reference[0], rtol=1e-6, atol=1e-6, msg=what)
    assert run[1].keys() == reference[1].keys()
    for name, grad in run[1].items():
        error = float((grad - reference[1][name]).norm() / reference[1][name].norm().clamp_min(1e-30))
        assert error <= 1e-6, f"{what}: gradient of {name} off by {error:.2e}"


@pytest.mark.parametrize("preset", PRESETS)
def test_tiled_mlp_and_checkpoint_groups_keep_logprobs_and_gradients(preset: str) -> None:
    reference = step(preset)
    assert_close(step(preset, "engine.mlp_chunk_tokens=16"), reference, f"{preset} tiled MLP")
    # the same forward; in backward a norm's own gradient contributions to its input are summed
    # before they join the residual's (in bf16 the norm's fp32 upcast does that anyway)
    normed = step(preset, "engine.recompute_norms=true")
    assert torch.equal(normed[0], reference[0])
    assert_close(normed, reference, f"{preset} recomputed norms")
    if preset in CUSTOM_PARALLELIZE:
        return  # its family checkpoints block by block: test_groups_need_the_family_to_pass_them
    grouped = step(preset, "engine.checkpoint_every_blocks=2")
    assert torch.equal(grouped[0], reference[0])  # the same operations in the same order
    assert all(torch.equal(grouped[1][n], g) for n, g in reference[1].items()), preset
    assert_close(step(preset, "engine.checkpoint_every_blocks=2", "engine.mlp_chunk_tokens=7"),
                 reference, f"{preset} both")


def test_each_mlp_chunk_recomputed_in_backward() -> None:
    """Tiled: the MLP's projections run once per chunk in forward and again per chunk in the
    backward's recompute (the checkpoint's replay, then the chunk's own), the biggest
    intermediate being one chunk's."""
    env = init_distributed(device_preference="cpu")
    cfg = compose(["model.preset=tiny-llama", "engine.device=cpu",
                   "engine.activation_checkpointing=true", "engine.mlp_chunk_tokens=10"])
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


def saved_bytes(run) -> int:
    """Bytes of the tensors autograd saves while ``run()`` runs (each storage once)."""
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if not isinstance(tensor, torch.nn.Parameter):
            storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return sum(storages.values())


def test_a_recomputed_norm_keeps_only_its_input() -> None:
    """A bf16 RMSNorm of the tiny Qwen3-MoE's blocks (its own fp32 arithmetic inside): recomputed,
    it saves its input alone and still gives the same output and gradients (recomputed in
    backward from that input)."""
    from graft.engine.recomputed_norms import apply_recomputed_norms, block_norms, final_norm

    cfg = compose(["model.preset=tiny-qwen3-moe", "engine.device=cpu"])
    model, family = build_model(cfg.model, seed=0)
    blocks = list(family.decoder_blocks(model.bfloat16()))
    norms = block_norms(blocks)
    assert len(norms) == 4 * len(blocks)  # input, post-attention, q and k norms
    x = torch.randn(2, 8, model.config.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    norm = blocks[0].input_layernorm
    plain_out, recomputed = {}, {}

    def backward(into: dict) -> None:
        into["bytes"] = saved_bytes(lambda: into.setdefault("out", norm(x)))
        into["grads"] = torch.autograd.grad(into["out"].float().square().sum(), [x, norm.weight])

    backward(plain_out)
    apply_recomputed_norms(blocks)
    backward(recomputed)
    assert recomputed["bytes"] == x.numel() * 2  # the bf16 input, nothing in fp32
    assert plain_out["bytes"] >= x.numel() * (4 + 2)  # its fp32 input and bf16 normalised values
    assert torch.equal(recomputed["out"], plain_out["out"])
    assert all(torch.equal(a, b) for a, b in zip(recomputed["grads"], plain_out["grads"],
                                                  strict=True))
    assert final_norm(model) == [model.model.norm]


def test_a_recomputed_norm_over_several_chunks_of_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 5 of 16 tokens: the same output bit for bit, the same gradients within
    rounding (the weight's is a sum over the chunks)."""
    from graft.engine import recomputed_norms

    cfg = compose(["model.preset=tiny-llama", "engine.device=cpu"])
    model, _ = build_model(cfg.model, seed=0)
    norm = model.model.norm
    x = torch.randn(2, 8, model.config.hidden_size, requires_grad=True)
    plain = norm(x)
    plain_grads = torch.autograd.grad(plain.square().sum(), [x, norm.weight])
    monkeypatch.setattr(recomputed_norms, "NORM_CHUNK_TOKENS", 5)
    recomputed_norms.apply_recomputed_norms([norm])
    calls: list[int] = []
    per_chunk = recomputed_norms._norm_grads
    monkeypatch.setattr(recomputed_norms, "_norm_grads", lambda *a: calls.append(1) or
                        per_chunk(*a))
    out = norm(x)
    grads = torch.autograd.grad(out.square().sum(), [x, norm.weight])
    assert torch.equal(out, plain) and len(calls) == 4  # 16 tokens: 5 + 5 + 5 + 1
    for got, want in zip(grads, plain_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


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
