"""`graft.engine.head.grads`: which heads take the two products with the weight's gradient summed
by the GEMM (a plain bias-free ``nn.Linear`` without hooks, its weight the only parameter; on
CUDA in 16 bits, checked on the GPU by ``bench/gpu/head_grads_check.py``), and that everywhere
else, CPU included, a chunk's gradients are autograd's, bit for bit."""

from __future__ import annotations

import torch

from graft.engine.head.chunked import chunked_head_logprobs
from graft.engine.head.fused_loss import fused_head_loss
from graft.engine.head.grads import linear_head_weight


def plain_head() -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(16, 40, bias=False)


def test_a_plain_linear_head_is_served_by_the_products():
    head = plain_head()
    assert linear_head_weight(head, [head.weight]) is head.weight


def test_heads_autograd_must_serve():
    head = plain_head()
    assert linear_head_weight(lambda x: head(x), [head.weight]) is None  # a function
    assert linear_head_weight(head, [head.weight, torch.nn.Parameter(torch.ones(2))]) is None
    assert linear_head_weight(head, [torch.nn.Parameter(head.weight.detach().clone())]) is None
    biased = torch.nn.Linear(16, 40)
    assert linear_head_weight(biased, [biased.weight]) is None

    class Adapted(torch.nn.Linear):  # a subclass (an adapter, FSDP2's FSDPLinear) may differ
        pass

    adapted = Adapted(16, 40, bias=False)
    assert linear_head_weight(adapted, [adapted.weight]) is None
    handle = head.register_forward_pre_hook(lambda module, args: None)
    assert linear_head_weight(head, [head.weight]) is None
    handle.remove()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, a, o: None)
    try:
        assert linear_head_weight(head, [head.weight]) is None
    finally:
        handle.remove()
    assert linear_head_weight(head, [head.weight]) is head.weight


def test_on_cpu_a_plain_head_keeps_autograds_gradients_bit_for_bit():
    head = plain_head()
    hidden = torch.randn(3, 9, 16)
    labels = torch.randint(0, 40, (3, 9))

    def grads(use, fused: bool):
        head.weight.grad = None
        h = hidden.clone().requires_grad_()
        if fused:
            _, _, loss = fused_head_loss(use, h, labels, None, lambda _t, lp: -lp.sum(),
                                         chunk_tokens=5, params=[head.weight])
        else:
            logp, _ = chunked_head_logprobs(use, h, labels, None, chunk_tokens=5,
                                            params=[head.weight])
            loss = -logp.sum()
        loss.backward()
        return head.weight.grad.clone(), h.grad.clone()

    for fused in (False, True):
        plain = grads(head, fused)
        wrapped = grads(lambda x: head(x), fused)
        assert all(torch.equal(a, b) for a, b in zip(plain, wrapped, strict=True))


def test_the_engines_head_under_fsdp2_is_a_plain_linear_head() -> None:
    """On the engine's path (FSDP2, the head applied after the model's forward to the captured
    hidden states), the head and its parameters are what `linear_head_weight` serves: a plain
    ``nn.Linear`` and its unsharded weight, not a DTensor. (Were the root resharded after its
    forward, the GPU's chunked heads would silently take autograd's slower path.)"""
    from graft.config import compose
    from graft.engine.distributed.env import init_distributed
    from graft.engine.distributed.parallelize import parallelize
    from graft.engine.forward import head_inputs, head_parameters, output_head
    from graft.models import build_model

    env = init_distributed(device_preference="cpu")
    cfg = compose(["model.preset=tiny-llama", "engine.device=cpu"])
    model, family = build_model(cfg.model, seed=0)
    model = parallelize(model.float(), family, cfg=cfg, mesh=env.mesh, device=env.device)
    with head_inputs(model):
        model(input_ids=torch.randint(0, model.config.vocab_size, (1, 8)))
    head, params = output_head(model), head_parameters(model)
    assert linear_head_weight(head, params) is head.weight
    assert type(head.weight.data) is torch.Tensor
