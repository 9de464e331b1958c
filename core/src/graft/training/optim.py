"""AdamW and the learning-rate schedule from ``cfg.optim``."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from graft.config.schema import OptimConfig


def build_optimizer(model: torch.nn.Module, optim: OptimConfig,
                    device: torch.device) -> torch.optim.Optimizer:
    """AdamW over the model's trainable parameters (fused kernels on CUDA)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps,
                             weight_decay=optim.weight_decay, fused=device.type == "cuda")


def lr_factor(step: int, *, total_steps: int, warmup_steps: int, scheduler: str) -> float:
    """Multiplier of the base learning rate after ``step`` completed steps (0-based)."""
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    if scheduler == "constant":
        return 1.0
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    progress = min(max(progress, 0.0), 1.0)
    if scheduler == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0 - progress


def build_scheduler(optimizer: torch.optim.Optimizer, optim: OptimConfig,
                    total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Warmup then constant, cosine or linear decay over ``total_steps``."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, total_steps=total_steps,
                                          warmup_steps=optim.warmup_steps,
                                          scheduler=optim.scheduler))
