"""DeepSeek-V4 from a local Hugging Face directory (``model.path``) in bf16, with QAT: the path a
real user takes. transformers keeps DeepSeek-V4's norms, attention sinks and hyper-connections in
fp32 (5.24 builds them so; 5.19 does on ``from_pretrained``), so the masters are mixed bf16/fp32;
FSDP2 refused them ("FSDP expects uniform original parameter dtype") before the core made them
one dtype (graft.engine). Runs on both transformers versions CI tests."""

from __future__ import annotations

import math
from pathlib import Path

from graft.config import ModelConfig, compose
from graft.data.tokenizer import load_tokenizer
from graft.models import build_model
from graft.training.trainer import Trainer


def test_a_bf16_checkpoint_trains_with_qat(tmp_path: Path) -> None:
    folder = tmp_path / "hf"
    model, _ = build_model(ModelConfig(preset="tiny-deepseek-v4"), seed=0)
    model.save_pretrained(folder)
    load_tokenizer(None, None).save_pretrained(folder)
    cfg = compose([f"trainer.run_dir={tmp_path / 'run'}", f"model.path={folder}",
                   "model.dtype=bfloat16", "engine.device=cpu", "trainer.mode=sft",
                   "trainer.total_steps=1", "trainer.global_batch_size=2",
                   "features.deepseek_v4.qat=fp8_blockwise", "checkpoint.every_steps=0",
                   "checkpoint.save_at_end=false", "export.hf_at_end=false"])
    rows = Trainer(cfg).fit()
    assert math.isfinite(rows[0]["loss"])
    assert rows[0]["deepseek_v4/qat_weight_passes"] == 1.0
