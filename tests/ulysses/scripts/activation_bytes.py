"""Activation bytes a rank keeps for backward on one long row, with rows split over ``SP`` ranks.

usage: [torchrun --nproc-per-node SP] activation_bytes.py OUT_JSON SP [TOKENS]

One sample of TOKENS (2048) tokens in one row, tiny-llama (SDPA, fp32), the SFT loss, one
forward + backward. Every tensor autograd saves for backward during it goes through a
saved-tensor hook; those with a token dimension (any dimension of at least TOKENS / 8 entries:
the preset's weights have none above 128) are summed once per storage: the activations. Rank 0
writes the largest rank's bytes, the loss and the gradients' full values.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from graft.config import compose
from graft.engine.batch.micro_batch import TokenSample
from graft.engine.distributed.env import (
    all_reduce,
    end_torchrun_worker,
    init_distributed,
    shutdown_distributed,
)
from graft.training.sft import sft_loss
from graft.training.trainer import build_engine


class SavedBytes:
    """Bytes of the distinct storages autograd saves that have a dimension >= ``threshold``."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self.storages: dict[int, int] = {}

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.dim() and max(tensor.shape) >= self.threshold:
            storage = tensor.untyped_storage()
            self.storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    @property
    def total(self) -> int:
        return sum(self.storages.values())


def main(out: str, sp: int, tokens: int) -> None:
    env = init_distributed(device_preference="cpu", sp_size=sp)
    cfg = compose(["model.preset=tiny-llama", "engine.device=cpu", "trainer.mode=sft",
                   f"engine.max_tokens_per_micro_batch={tokens}", f"features.ulysses.sp_size={sp}"])
    engine = build_engine(cfg, env, pad_token_id=0)
    ids = torch.randint(3, 100, (tokens,), generator=torch.Generator().manual_seed(3)).tolist()
    batches = engine.micro_batches([TokenSample(ids, response_start=tokens // 4)])
    saved = SavedBytes(tokens // 8)
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda tensor: tensor):
        pending = engine.forward_backward(batches, sft_loss, loss_scale_factor=1.0)
    loss = pending.result().loss
    grads = {n: p.grad.full_tensor().flatten()[:64].tolist()
             for n, p in engine.model.named_parameters()}
    largest = all_reduce(torch.tensor([saved.total], dtype=torch.float64), op=dist.ReduceOp.MAX)
    if env.is_main:
        with open(out, "w") as f:
            json.dump({"sp": sp, "tokens": tokens, "activation_bytes": int(largest.item()),
                       "loss": loss, "grads": grads}, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 2048)
    shutdown_distributed()
    end_torchrun_worker()
