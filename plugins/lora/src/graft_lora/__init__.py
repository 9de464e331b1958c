"""graft-lora: LoRA adapters on a model's linear layers and fused MoE expert weights.

Only the adapters train; the base stays frozen, is left out of checkpoints (``model.path`` or
the seed rebuilds it) and is merged with the adapters' product in every export. The entry
module is `graft_lora.plugin`; `write_adapter` saves the adapters as a PEFT adapter directory.
Importing this package is cheap (no torch): Graft imports the plugin for every command.
"""

from typing import Any

from graft_lora.config import LoraConfig

__all__ = ["LoraConfig", "write_adapter"]


def __getattr__(name: str) -> Any:
    if name == "write_adapter":
        from graft_lora.adapter_dir import write_adapter

        return write_adapter
    raise AttributeError(f"module 'graft_lora' has no attribute {name!r}")
