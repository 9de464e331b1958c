"""The adapters as a rollout engine loads them itself (``graft_rollout_adapter``,
``features.lora.engine_sync`` ``adapter`` or ``auto``): graft-vllm starts vLLM from the frozen base, exported
once inside `PeftRolloutAdapter.base_only`, and after every update loads the adapters from the
PEFT adapter directory `PeftRolloutAdapter.write` replaces (vLLM's LoRA loading); with
``adapter``, the embedded engine's static decode copy holds the frozen base and gets the
adapters unmerged (`PeftRolloutAdapter.install`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from torch import nn

from graft_lora.adapter_dir import base_model_name, peft_config, whole, write_adapter_dir
from graft_lora.apply import base_only, clean_name
from graft_lora.config import lora_section
from graft_lora.layers import is_adapted, mirror_adapters

FALLBACK = "features.lora.engine_sync=merged"


class PeftRolloutAdapter:
    """`graft.rollout.RolloutAdapter` of an adapted policy: its adapters as a PEFT directory."""

    fallback = FALLBACK

    def __init__(self, model: nn.Module, cfg: Any) -> None:
        self.model = model
        self.section = lora_section(cfg)
        self.base = base_model_name(cfg)
        self.rank = self.section.rank
        self.required = self.section.engine_sync == "adapter"
        config = peft_config(model, self.section, base=self.base)
        self.targets = [*config["target_modules"], *(config["target_parameters"] or [])]

    @contextmanager
    def base_only(self) -> Iterator[None]:
        """Exports of the model inside carry its frozen base, the adapters left out."""
        with base_only(self.model):
            yield

    def write(self, out_dir: Path, *, is_main: bool) -> None:
        """The current adapters into ``out_dir``, replaced whole (every rank gathers)."""
        write_adapter_dir(self.model, out_dir, self.section, base=self.base, is_main=is_main)

    def install(self, model: nn.Module) -> None:
        """The adapters into ``model``, a plain copy of the policy holding the frozen base,
        unmerged as in the trainer's forward (every rank gathers)."""
        for name, module in self.model.named_modules():
            if not is_adapted(module):
                continue
            values = {part: whole(module._parameters[part]).detach()
                      for pair in module.adapted_weights().values() for part in pair}
            mirror_adapters(model.get_submodule(clean_name(name)), module, values)
