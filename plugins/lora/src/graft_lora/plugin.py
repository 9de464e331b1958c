"""graft-lora's table of contents: every point where it touches Graft's core, in the order of a
run. Every hook is a no-op while ``features.lora.enabled`` is false.
"""

from __future__ import annotations

import weakref
from typing import Any

from graft import hookimpl
from graft_lora.config import SECTION, LoraConfig, lora_enabled, lora_section

# The models given adapters (only these have a frozen base to leave out of checkpoints).
_ADAPTED: weakref.WeakSet[Any] = weakref.WeakSet()


@hookimpl
def graft_config_sections() -> list[tuple[str, type]]:
    """``features.lora`` (`LoraConfig`)."""
    return [(SECTION, LoraConfig)]


@hookimpl
def graft_config_rules() -> list[Any]:
    """What adapters cannot be combined with, refused before anything runs."""
    from graft_lora.rules import lora_fits_the_run

    return [lora_fits_the_run]


@hookimpl
def graft_pre_shard(model: Any, cfg: Any, role: str) -> None:
    """Freeze the policy and give it adapters (the frozen KL reference stays the base); the
    frozen base is stored in the compute dtype (bf16 on GPU: half the memory, the same
    forward, since FSDP2 casts it to that dtype anyway); the adapters keep fp32 masters."""
    if role != "policy" or not lora_enabled(cfg):
        return
    from graft.engine import mixed_precision_policy
    from graft_lora.apply import apply_lora, store_frozen_in

    apply_lora(model, lora_section(cfg), seed=cfg.trainer.seed)
    device = next(model.parameters()).device
    store_frozen_in(model, mixed_precision_policy(cfg.engine.mixed_precision, device).param_dtype)
    _ADAPTED.add(model)


@hookimpl
def graft_weights_loaded(model: Any, missing: list[str], seed: int) -> list[str]:
    """The adapters of a ``model.path`` build: their initial values, as from a preset."""
    from graft_lora.apply import initialise_missing

    return initialise_missing(model, missing, seed)


@hookimpl
def graft_ckpt_save(state: dict[str, Any], model: Any) -> None:
    """Checkpoints hold the adapters and their optimizer state, not the frozen base."""
    if model not in _ADAPTED:
        return
    from graft_lora.apply import frozen_names

    for name in frozen_names(model):
        state["model"].pop(name, None)


@hookimpl
def graft_ckpt_load(model: Any, ctx: Any) -> None:
    """The frozen base a checkpoint left out keeps the value the build gave it."""
    if model not in _ADAPTED:
        return
    from graft_lora.apply import frozen_names

    ctx.keep_fresh.update(f"model.{name}" for name in frozen_names(model)
                          if f"model.{name}" not in ctx.checkpoint_keys)


@hookimpl
def graft_train_end(model: Any, cfg: Any, run_dir: Any, is_main: bool) -> None:
    """The run's adapters as a PEFT adapter directory, ``<run_dir>/adapter``, written as a
    Graft export is (replaced whole, a folder of someone else's files refused)."""
    if model not in _ADAPTED:
        return
    from graft_lora.adapter_dir import base_model_name, write_adapter_dir

    write_adapter_dir(model, run_dir / "adapter", lora_section(cfg), base=base_model_name(cfg),
                      is_main=is_main)


@hookimpl
def graft_export_formats() -> dict[str, Any]:
    """``graft export --format adapter``: a checkpoint's adapters as a PEFT adapter directory."""
    return {"adapter": write_adapter_format}


def write_adapter_format(*, model: Any, out_dir: Any, cfg: Any) -> None:
    """The ``adapter`` format (`graft_lora.adapter_dir.write_adapter_format`), imported when an
    export runs: every command registers the plugin's formats, and they must not import torch."""
    from graft_lora.adapter_dir import write_adapter_format as write

    write(model=model, out_dir=out_dir, cfg=cfg)


@hookimpl
def graft_export_entries(model: Any, entries: list[tuple[str, Any]]
                         ) -> list[tuple[str, Any]] | None:
    """Exports (HF directories, weight syncs, the decode copy) get the merged weights
    ``W + scale * B @ A``, not the adapters (a rollout engine's first weights with
    ``engine_sync=adapter``: the frozen base)."""
    if model not in _ADAPTED:  # the decode copy, the KL reference, a run without adapters
        return None
    from graft_lora.apply import merged_entries

    return merged_entries(model, entries)


@hookimpl
def graft_rollout_adapter(model: Any, cfg: Any) -> Any:
    """``features.lora.engine_sync`` ``adapter`` (or ``auto``): a rollout engine that loads
    adapters itself (graft-vllm) gets the frozen base once, then only the adapters, as a PEFT
    directory."""
    if model not in _ADAPTED or lora_section(cfg).engine_sync == "merged":
        return None
    from graft_lora.rollout_adapter import PeftRolloutAdapter

    return PeftRolloutAdapter(model, cfg)
