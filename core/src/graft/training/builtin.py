"""The training package's hooks, registered as a built-in plugin: the ``sft`` trainer mode, the
``trainer_modes`` registry, the rules that tie ``engine.ep_size`` to the model family and the
micro-batch budget to the longest sample, and ``graft train``'s pre-flight of the files a run
loads.

Kept free of torch imports at module level: the plugin manager loads it for every command, and
the pre-flight runs before torchrun starts ranks.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from graft.config import was_set
from graft.errors import ConfigError
from graft.hookspecs import hookimpl
from graft.plugins import GraftPluginManager
from graft.plugins.registry import registry_names

RUNS = Path("runs")  # where a run without trainer.run_dir goes (graft.training.run_dir.RUNS)


def sft_job_class() -> type:
    """`graft.training.sft.SFTJob`: supervised fine-tuning on prompt/response pairs."""
    from graft.training.sft import SFTJob

    return SFTJob


@hookimpl
def graft_trainer_modes() -> dict[str, Any]:
    """``sft`` (``rl`` comes from `graft.rl.builtin`)."""
    from graft.data.sampler import batch_checked_job

    return {"sft": batch_checked_job(sft_job_class, batch_key="trainer.global_batch_size",
                                     what="samples")}


@hookimpl
def graft_config_choices() -> dict[str, Any]:
    """``trainer_modes``."""
    return {"trainer_modes": registry_names("graft_trainer_modes", "trainer mode")}


@hookimpl
def graft_config_rules() -> list[Any]:
    """`expert_parallel_needs_a_family`, `micro_batch_holds_the_longest_sample`."""
    return [expert_parallel_needs_a_family, micro_batch_holds_the_longest_sample]


def micro_batch_holds_the_longest_sample(cfg: Any, user_keys: Any) -> None:
    """Unless the user set ``engine.max_tokens_per_micro_batch``, it grows to the longest sample
    a step can have: ``data.max_prompt_tokens`` plus ``rollout.max_new_tokens`` (RL) or
    ``data.max_response_tokens`` (SFT), in tokens. So a default never stops a run that asked
    for long responses after its first rollout; a budget the user chose stays (a sample over
    it is a `DataError` naming it)."""
    response = {"rl": cfg.rollout.max_new_tokens,
                "sft": cfg.data.max_response_tokens}.get(cfg.trainer.mode)
    # a plugin's trainer mode has samples of its own; a budget the user set is theirs
    if response is None or was_set("engine.max_tokens_per_micro_batch", user_keys):
        return
    longest = cfg.data.max_prompt_tokens + response
    cfg.engine.max_tokens_per_micro_batch = max(cfg.engine.max_tokens_per_micro_batch, longest)


def expert_parallel_needs_a_family(cfg: Any, manager: GraftPluginManager) -> None:
    """``engine.ep_size > 1`` only with a model family that implements expert parallelism
    (checked before any rank starts, so ``graft train --nproc N`` fails in one line)."""
    ep = cfg.engine.ep_size  # >= 1: a `bounded` field
    if ep == 1:
        return
    from graft.engine.distributed.parallelize import check_expert_parallel
    from graft.models.build import local_model_type
    from graft.models.registry import family_for, model_families, preset

    if cfg.model.path:
        model_type = local_model_type(cfg.model.path)
        if model_type is None:  # not on this machine (an example for a cluster): checked at load
            return
        family = family_for(model_type, manager)
    else:
        family = preset(cfg.model.preset, manager)[0]
    check_expert_parallel(family, ep, list(model_families(manager).values()))


@hookimpl(trylast=True)
def graft_preflight(cfg: Any) -> None:
    """Raise the `graft.errors.GraftError` that loading ``cfg``'s model directory and weights
    (``model.path``), tokenizer files (``data.tokenizer``, else ``model.path``) or dataset files
    (``data.path`` for ``data.source=file``, ``data.val_path``) would raise, in the order a run
    loads them; then check that the run directory can be written (`check_run_dir_writable`).
    Each check is the function loading itself calls, so the message is the same either way."""
    from graft.data.files import dataset_file, training_file
    from graft.data.tokenizer import tokenizer_source
    from graft.models.build import model_weights

    if cfg.model.path:
        model_weights(cfg.model.path)
    tokenizer_source(cfg.data.tokenizer, cfg.model.path)
    path = training_file(cfg.data)
    if path is not None:
        dataset_file(path, "data.path")
    if cfg.data.val_path:
        dataset_file(cfg.data.val_path, "data.val_path")
    check_run_dir_writable(cfg.trainer.run_dir)


def check_run_dir_writable(run_dir: str | None) -> None:
    """`ConfigError` unless files can be created in ``trainer.run_dir`` (unset: under ``runs/``
    in the current folder), or in the nearest existing folder above it when it does not exist
    yet: a read-only disk, a missing permission, or a file where a folder is needed. A probe
    file is created there and removed at once (a permission check alone misses read-only
    mounts for root)."""
    target = Path(run_dir).expanduser() if run_dir else RUNS
    what = (f"trainer.run_dir {run_dir!r}" if run_dir
            else f"trainer.run_dir is unset, so the run goes under {str(RUNS)!r}, and that")
    existing = target
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{what} cannot be created: {existing} is a file, not a folder; set "
                          f"trainer.run_dir to a folder you can write to")
    try:
        handle, probe = tempfile.mkstemp(prefix=".graft-write-check-", dir=existing)
        os.close(handle)
        os.unlink(probe)
    except OSError as exc:
        where = "" if existing == target else f" (in {existing}, where it would be created)"
        raise ConfigError(f"{what} is not writable: cannot create a file{where}: "
                          f"{exc.strerror or exc}; set trainer.run_dir to a folder you can "
                          f"write to") from exc
