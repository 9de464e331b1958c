"""``graft_export_formats``: a plugin's format of a checkpoint, written from the run's model
rebuilt in this process with the checkpoint's weights, into a folder swapped in whole and
marked as Graft's (a rerun replaces it; a folder of other files is refused). The core alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from graft import hookimpl
from graft.checkpoint.layout import read_latest
from graft.config import compose
from graft.errors import ConfigError
from graft.export.rebuilt import export_rebuilt
from graft.training.trainer import Trainer


class NormsFormat:
    """Format ``norms``: each parameter's name and sum, as JSON."""

    @hookimpl
    def graft_export_formats(self) -> dict[str, Any]:
        return {"norms": self.write}

    @staticmethod
    def write(*, model: Any, out_dir: Path, cfg: Any) -> None:
        sums = {name: float(p.detach().full_tensor().sum()) for name, p in model.named_parameters()}
        (out_dir / "sums.json").write_text(json.dumps({"seed": cfg.trainer.seed, **sums}))


def test_hook_graft_export_formats_writes_the_checkpoint_s_model(graft_plugin,
                                                                 tmp_path: Path) -> None:
    graft_plugin(NormsFormat(), name="norms-format")
    run = Trainer(compose([f"trainer.run_dir={tmp_path / 'run'}", "model.preset=tiny-llama",
                           "engine.device=cpu", "trainer.mode=sft", "trainer.total_steps=1",
                           "export.hf_at_end=false"]))
    run.fit()
    trained = {name: float(p.detach().full_tensor().sum()) for name, p in run.engine.model.named_parameters()}
    ckpt = read_latest(tmp_path / "run")
    out = tmp_path / "norms"
    for _ in range(2):  # a rerun replaces the folder it wrote
        assert export_rebuilt(ckpt, out, fmt="norms", dtype_name="auto", protected={}) == 0
        assert json.loads((out / "sums.json").read_text()) == {"seed": 0, **trained}
    assert sorted(p.name for p in out.iterdir()) == [".graft-export.json", "sums.json"]
    (out / "mine.txt").write_text("not Graft's")
    with pytest.raises(ConfigError, match="holds files Graft did not write"):
        export_rebuilt(ckpt, out, fmt="norms", dtype_name="auto", protected={})
    with pytest.raises(ConfigError, match=r"--format nope: no such format.*hf, norms"):
        export_rebuilt(ckpt, tmp_path / "x", fmt="nope", dtype_name="auto", protected={})
