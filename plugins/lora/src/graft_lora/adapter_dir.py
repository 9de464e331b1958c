"""The adapters as a PEFT adapter directory (``adapter_config.json`` and
``adapter_model.safetensors``): what ``PeftModel.from_pretrained(base, folder)`` loads.

PEFT's names: a linear layer's ``<module>.lora_A.weight`` (rank x in) and ``lora_B.weight``
(out x rank); a fused experts module's 3-D weights are ``target_parameters``, wrapped one
inside the other in the order they are listed (the first innermost, ``<module>.base_layer``
once per wrapper outside it), with ``lora_A.weight`` = A reshaped (experts * rank) x in and
``lora_B.weight`` = B laid out out x (rank * experts).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from graft.errors import ConfigError
from graft_lora.apply import clean_name
from graft_lora.config import LoraConfig, lora_section
from graft_lora.layers import ExpertsAdapter, is_adapted

PREFIX = "base_model.model."


def peft_tensors(model: nn.Module, *, is_main: bool = True) -> dict[str, torch.Tensor]:
    """Every adapter of ``model`` under its PEFT name, gathered whole (a collective on a
    sharded model: every rank calls it; only ``is_main`` gets tensors)."""
    tensors: dict[str, torch.Tensor] = {}
    for module_name, module in model.named_modules():
        if not is_adapted(module):
            continue
        prefix = PREFIX + clean_name(module_name)
        weights = list(module.adapted_weights().items())
        for index, (_, (a_name, b_name)) in enumerate(weights):
            a, b = whole(module._parameters[a_name]), whole(module._parameters[b_name])
            if not is_main:
                continue
            key = prefix
            if isinstance(module, ExpertsAdapter):
                key += ".base_layer" * (len(weights) - 1 - index)
                experts, rank = a.shape[0], a.shape[1]
                a = a.reshape(experts * rank, a.shape[2])
                b = b.permute(1, 2, 0).reshape(b.shape[1], rank * experts)
            tensors[f"{key}.lora_A.weight"] = a.detach().to("cpu").contiguous()
            tensors[f"{key}.lora_B.weight"] = b.detach().to("cpu").contiguous()
    return tensors


def whole(value: torch.Tensor) -> torch.Tensor:
    """``value`` whole: gathered from its shards when it is a DTensor (a collective)."""
    from torch.distributed.tensor import DTensor

    return value.full_tensor() if isinstance(value, DTensor) else value


def peft_config(model: nn.Module, section: LoraConfig, *, base: str) -> dict[str, Any]:
    """``adapter_config.json`` for ``model``'s adapters (``base``: the base model's path or
    name, PEFT's ``base_model_name_or_path``)."""
    linear, parameters = set(), []
    for module_name, module in model.named_modules():
        if isinstance(module, ExpertsAdapter):
            owner = clean_name(module_name).rsplit(".", 1)[-1]
            parameters += [f"{owner}.{w}" for w in module.lora_weights
                           if f"{owner}.{w}" not in parameters]
        elif is_adapted(module):
            linear.add(module_name.rsplit(".", 1)[-1])
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base,
            "r": section.rank, "lora_alpha": section.alpha, "lora_dropout": section.dropout,
            "target_modules": sorted(linear), "target_parameters": parameters or None,
            "bias": "none", "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
            "init_lora_weights": True, "inference_mode": True, "modules_to_save": None}


def write_adapter(model: nn.Module, out_dir: Path, section: LoraConfig, *, base: str,
                  is_main: bool = True) -> None:
    """Write ``model``'s adapters to ``out_dir`` as a PEFT adapter directory (call on every
    rank of a sharded model; ``is_main`` writes)."""
    tensors = peft_tensors(model, is_main=is_main)
    if is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        _write(out_dir, tensors, model, section, base)


def _write(folder: Path, tensors: dict[str, torch.Tensor], model: nn.Module,
           section: LoraConfig, base: str) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = peft_config(model, section, base=base)
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")


def write_adapter_dir(model: nn.Module, out_dir: Path, section: LoraConfig, *, base: str,
                      is_main: bool = True) -> None:
    """`write_adapter` into ``out_dir`` replaced whole and marked as Graft's
    (`graft.output_dirs.write_folder`): the run's end's ``<run_dir>/adapter``. Every rank
    gathers; ``is_main`` writes."""
    from graft import __version__
    from graft.output_dirs import write_folder

    tensors = peft_tensors(model, is_main=is_main)
    if is_main:
        write_folder(out_dir, lambda folder: _write(folder, tensors, model, section, base),
                     written_by=f"graft {__version__}", label="the adapter folder")


def base_model_name(cfg: Any) -> str:
    """The base model an adapter directory names (PEFT's ``base_model_name_or_path``): the
    run's ``model.path``, else its preset."""
    return cfg.model.path or cfg.model.preset


def write_adapter_format(*, model: nn.Module, out_dir: Path, cfg: Any) -> None:
    """``graft export --format adapter`` (``graft_export_formats``): ``model``, the run rebuilt
    with the checkpoint's adapters, as a PEFT adapter directory in ``out_dir``."""
    if not any(is_adapted(module) for module in model.modules()):
        raise ConfigError("graft export --format adapter: this checkpoint's run has no adapters "
                          "(features.lora.enabled was false); export it as hf")
    write_adapter(model, out_dir, lora_section(cfg), base=base_model_name(cfg))
