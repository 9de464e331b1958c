"""graft-exact: kernels whose result for a token does not depend on the batch around it
(entry point ``exact``, ``features.exact.enabled``).

With them the trainer's forward (the log-probs it trains on) and the embedded engine's prefill
and decode steps compute every token's logits from the same weights with the same operations in
the same order, whatever the batch size, the packing of rows, the token's position in its row or
the KV-cache length, so the rollout's sampling log-probs equal the trainer's bit for bit.

- `graft_exact.plugin`: where the plugin touches Graft's core (the hooks);
- `graft_exact.matmul`: products in fixed row tiles (on CUDA a Triton kernel of one tile
  configuration, ``K`` summed in fixed chunks);
- `graft_exact.attention`: attention over each query's own key window, reduced in its
  order (`graft_exact.attention_grad`: its gradient, the ordinary attention's);
- `graft_exact.reductions`: pairwise-tree sums, softmaxes, SiLU (one Triton kernel on
  CUDA);
- `graft_exact.norm`, `graft_exact.rotary`: RMSNorms and the rotary embedding
  as one kernel per call on CUDA;
- `graft_exact.experts`: MoE experts (one grouped Triton product per projection on CUDA);
- `graft_exact.mode`: `exact_kernels`, the dispatch mode that puts them in the model;
- `graft_exact.support`: what they cannot serve (a `ConfigError` naming it).

The names below are loaded on first access (importing the plugin stays free of torch).
"""

from graft import lazy_attributes

__version__ = "0.1.0"

_LAZY = {
    "ExactKernelError": "graft_exact.mode",
    "exact_active": "graft_exact.mode",
    "exact_kernels": "graft_exact.mode",
    "install_exact_kernels": "graft_exact.install",
    "check_exact_support": "graft_exact.support",
}

__all__ = ["__version__", *_LAZY]


__getattr__ = lazy_attributes(__name__, _LAZY)
