"""Train a bf16 tiny DeepSeek-V3 whose routers keep fp32 masters (as transformers 5.24 builds it;
earlier versions cast every parameter, so a ``graft_pre_shard`` hook keeps the routers in fp32)
for 3 steps under bf16 mixed precision, sharded over the ranks; from the preset or a local
directory.

    torchrun --nproc-per-node N mixed_dtype_model.py OUT_DIR [HF_DIR]

Rank 0 saves ``result.pt``: the losses, the router's master dtype and the dtype its weight has
while its forward runs (and an expert's), and the final full weights.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from graft import hookimpl
from graft.config import compose
from graft.engine.distributed.env import end_torchrun_worker, init_distributed, shutdown_distributed
from graft.engine.distributed.parallelize import build_parallel_model
from graft.export.stream import hf_tensors
from graft.plugins import get_plugin_manager


class KeepRoutersInFp32:
    """What transformers 5.24 does for DeepSeek-V3 (``_keep_in_fp32_modules_strict``)."""

    @hookimpl
    def graft_pre_shard(self, model: torch.nn.Module) -> None:
        for name, module in model.named_modules():
            if name.endswith("mlp.gate"):
                module.float()


def main(out_dir: str, hf_dir: str | None) -> None:
    get_plugin_manager().register(KeepRoutersInFp32(), name="keep-routers-in-fp32")
    env = init_distributed(device_preference="cpu")
    source = f"model.path={hf_dir}" if hf_dir else "model.preset=tiny-deepseek-v3"
    cfg = compose([source, "model.dtype=bfloat16", "engine.device=cpu",
                   "engine.mixed_precision=bf16"])
    model, _ = build_parallel_model(env, cfg=cfg)
    router = model.model.layers[1].mlp.gate
    computed: dict[str, torch.dtype] = {}
    router.register_forward_pre_hook(lambda m, _: computed.update(router=m.weight.dtype))
    experts = model.model.layers[1].mlp.experts
    experts.register_forward_pre_hook(lambda m, _: computed.update(experts=m.gate_up_proj.dtype))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(0, model.config.vocab_size, (2, 16),
                        generator=torch.Generator().manual_seed(0))
    losses = []
    for _ in range(3):
        logits = model(input_ids=ids, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(),
                                                 ids[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    weights = {name: tensor.clone() for name, tensor in hf_tensors(model, dtype=None,
                                                                   is_main=env.is_main)}
    if env.is_main:
        torch.save({"losses": losses, "router_master": router.weight.dtype,
                    "computed": computed, "weights": weights}, Path(out_dir) / "result.pt")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
    shutdown_distributed()
    end_torchrun_worker()
