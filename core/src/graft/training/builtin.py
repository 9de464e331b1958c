"""The core's trainer modes, registered as a built-in plugin (``graft_trainer_modes``).

Kept free of torch imports at module level: the plugin manager loads it for every command.
"""

from __future__ import annotations

from typing import Any

from graft.hookspecs import hookimpl


def rl_job(*, cfg: Any, tokenizer: Any, env: Any) -> Any:
    """Generate, score, update, push weights to the generator, repeat."""
    from graft.data.sampler import check_every_rank_gets_samples
    from graft.rl.job import RLJob

    check_every_rank_gets_samples(cfg.rollout.prompts_per_step, env.dp_size,
                                  key="rollout.prompts_per_step", what="prompts")
    return RLJob(cfg, tokenizer, env)


def sft_job(*, cfg: Any, tokenizer: Any, env: Any) -> Any:
    """Supervised fine-tuning on prompt/response pairs."""
    from graft.data.sampler import check_every_rank_gets_samples
    from graft.training.sft import SFTJob

    check_every_rank_gets_samples(cfg.trainer.global_batch_size, env.dp_size,
                                  key="trainer.global_batch_size", what="samples")
    return SFTJob(cfg, tokenizer, env)


@hookimpl
def graft_trainer_modes() -> dict[str, Any]:
    """``rl`` and ``sft``."""
    return {"rl": rl_job, "sft": sft_job}

