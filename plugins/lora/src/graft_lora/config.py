"""The ``features.lora`` config section (no torch: imported by every command)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from graft.config import bounded, choice

SECTION = "lora"


@dataclass
class LoraConfig:
    """``features.lora``: low-rank adapters ``W + (alpha / rank) * B @ A`` on the policy's
    linear layers and fused expert weights; everything else is frozen."""

    enabled: bool = False
    # The adapters' rank r (A is r x in, B is out x r; per expert for fused experts).
    rank: int = bounded(16, ge=1)
    # The scale of the adapters' product is alpha / rank.
    alpha: float = bounded(32.0, gt=0.0)
    # Dropout on a linear adapter's input (training only; fused experts take none, as in PEFT).
    dropout: float = bounded(0.0, ge=0.0, lt=1.0)
    # Linear layers that get adapters, by the last part of their module name.
    target_modules: list[str] = field(default_factory=lambda: [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    # Give every fused 3-D expert weight (an ``experts`` module's gate_up_proj, down_proj, ...)
    # adapters of its own per expert.
    experts: bool = True
    # How a rollout engine follows the trainer: ``adapter``: the frozen base once, then only
    # the adapters after each update (graft-vllm: the engine's LoRA loading, where it cannot
    # serve the targets a config error names this key; the embedded engine's decode copy:
    # shares the trainer's frozen base and applies the adapters unmerged); ``merged``: every
    # weight, merged with the adapters' product, at every sync; ``auto``: for vLLM adapter where
    # it can serve the targets, else merged (the run says which); for the decode copy merged
    # (the faster decode), adapter under features.exact.
    engine_sync: str = choice("auto", ("auto", "adapter", "merged"))


def lora_section(cfg: Any) -> LoraConfig:
    """``cfg.features.lora`` of the root config, or the defaults without this section."""
    section = getattr(getattr(cfg, "features", None), SECTION, None)
    return LoraConfig() if section is None else section


def lora_enabled(cfg: Any) -> bool:
    """Whether ``features.lora.enabled`` is set in ``cfg`` (the root config)."""
    return bool(lora_section(cfg).enabled)
