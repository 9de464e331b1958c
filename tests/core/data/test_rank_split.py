"""Every data-parallel rank gets a share of each step's global batch, or the run is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from graft.data.sampler import check_every_rank_gets_samples
from graft.errors import ConfigError
from graft.testing.checkpoint import run_graft


def test_a_batch_smaller_than_the_ranks_is_refused_with_the_fix() -> None:
    check_every_rank_gets_samples(2, 2, key="rollout.prompts_per_step", what="prompts")
    with pytest.raises(ConfigError, match=r"rollout.prompts_per_step=1 .* ranks \(2\).* at least 2"):
        check_every_rank_gets_samples(1, 2, key="rollout.prompts_per_step", what="prompts")


@pytest.mark.parametrize("mode, key", [("rl", "rollout.prompts_per_step"),
                                       ("sft", "trainer.global_batch_size")])
@pytest.mark.slow
def test_two_ranks_with_one_prompt_or_sample_stop_with_a_config_error(tmp_path: Path, mode: str,
                                                                      key: str) -> None:
    # Before the check, RL hung (the test fails at the timeout, stopping every rank) and SFT
    # failed with a traceback on the empty rank.
    result = run_graft(["train", "--nproc", "2", f"trainer.run_dir={tmp_path}",
                        f"trainer.mode={mode}", "model.preset=tiny-llama", f"{key}=1",
                        "trainer.total_steps=1", "engine.device=cpu",
                        "checkpoint.save_at_end=false", "export.hf_at_end=false"],
                       timeout_s=240)
    assert result.returncode != 0
    assert (f"graft: error: {key}=1 is less than the number of data-parallel ranks (2)"
            in result.stdout), result.stdout[-3000:]
