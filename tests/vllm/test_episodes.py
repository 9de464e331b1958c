"""Multi-turn episodes with the vLLM engine: graft-multiturn's episode checks
(tests/multiturn/test_episodes.py) run with ``rollout.engine=vllm``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

CORE_TESTS = Path(__file__).resolve().parents[1] / "multiturn" / "test_episodes.py"


def core_episode_checks():
    """graft-multiturn's test module, loaded from its file (test files are not importable by name)."""
    spec = importlib.util.spec_from_file_location("core_episode_checks", CORE_TESTS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_trainer_sees_the_generated_and_the_environments_ids_unchanged(
        graft_plugin, requires_vllm: None, tmp_path: Path) -> None:
    core_episode_checks().check_ids_unchanged(graft_plugin, tmp_path, "vllm")


@pytest.mark.slow  # torchrun, 2 gloo ranks, 2 steps, vLLM in its own process (~65 s)
def test_every_rank_runs_the_busiest_ranks_turns(requires_vllm: None, tmp_path: Path) -> None:
    core_episode_checks().check_two_ranks(tmp_path, "vllm")
