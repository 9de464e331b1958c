"""``rollout.exact``: kernels whose result for a token does not depend on the batch around it.

With them the trainer's forward (the log-probs it trains on) and the embedded engine's prefill
and decode steps compute every token's logits from the same weights with the same operations in
the same order, whatever the batch size, the packing of rows, the token's position in its row or
the KV-cache length, so the rollout's sampling log-probs equal the trainer's bit for bit.

- `graft.engine.exact.matmul`: products in fixed row tiles (on CUDA a Triton kernel of one tile
  configuration, ``K`` summed in fixed chunks);
- `graft.engine.exact.attention`: attention over each query's own key window, reduced in its
  order (`graft.engine.exact.attention_grad`: its gradient, the ordinary attention's);
- `graft.engine.exact.reductions`: pairwise-tree sums, softmaxes, SiLU (one Triton kernel on
  CUDA);
- `graft.engine.exact.norm`, `graft.engine.exact.rotary`: RMSNorms and the rotary embedding
  as one kernel per call on CUDA;
- `graft.engine.exact.experts`: MoE experts (one grouped Triton product per projection on CUDA);
- `graft.engine.exact.mode`: `exact_kernels`, the dispatch mode that puts them in the model;
- `graft.engine.exact.support`: what they cannot serve (a `ConfigError` naming it).
"""

from __future__ import annotations

from graft.engine.exact.install import install_exact_kernels
from graft.engine.exact.mode import ExactKernelError, exact_active, exact_kernels
from graft.engine.exact.support import check_exact_support

__all__ = ["ExactKernelError", "check_exact_support", "exact_active", "exact_kernels",
           "install_exact_kernels"]
