"""The installed plugin through Graft: graft.testing's conformance check, its section, the old
core key ``rollout.decode_fuse_kernels`` refused with the new one named, the GPU defaults as
before the move, which static copies get its loop (``graft_static_decoder``), and every step of
the loop inside the plugins' ``graft_compute``."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import graft_graphed_decode.plugin as plugin
from graft import hookimpl
from graft.config import compose
from graft.config.auto import resolve_auto
from graft.errors import ConfigError
from graft.testing import check_config_section, check_installed_plugin
from graft.training.trainer import Trainer
from graft_graphed_decode import GraphedDecodeConfig, GraphedDecoder
from tests.core.rollout.test_greedy import assert_greedy, greedy_trainer

RUN = ("engine.device=cpu", "checkpoint.every_steps=0", "checkpoint.save_at_end=false",
       "export.hf_at_end=false", "trainer.print_sample_every_steps=0", "trainer.total_steps=1",
       "rollout.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=4")
CPU = torch.device("cpu")


def test_the_installed_plugin_passes_graft_testing() -> None:
    assert set(check_installed_plugin("graphed_decode")) == {"graft_config_sections",
                                                             "graft_static_decoder"}
    assert check_config_section("graphed_decode", GraphedDecodeConfig) == {
        "enabled": True, "fuse_kernels": True}


def test_the_old_core_key_names_the_new_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"'rollout\.decode_fuse_kernels'.*moved: set "
                       r"'features\.graphed_decode\.fuse_kernels'.*graft-graphed-decode"):
        compose(["rollout.decode_fuse_kernels=false"])
    run = tmp_path / "run.yaml"
    run.write_text("rollout:\n  decode_fuse_kernels: false\n")
    with pytest.raises(ConfigError, match=r"run.yaml, line 2\).*features\.graphed_decode"):
        compose([], [run])
    run.write_text("rollout:\n  decode_fuse_kernels: true\n")  # an earlier version's config.yaml
    assert compose([], [run]).features.graphed_decode.fuse_kernels is True


def test_the_gpu_defaults_are_the_fused_graphed_loop_as_before() -> None:
    on_gpu, _ = resolve_auto(compose([]), "cuda")
    assert (on_gpu.rollout.decode, on_gpu.rollout.decode_compile) == ("static", "cudagraphs")
    assert on_gpu.features.graphed_decode == GraphedDecodeConfig(enabled=True, fuse_kernels=True)


def tiny_model(model_type: str = "llama", **overrides: Any) -> torch.nn.Module:
    config = AutoConfig.for_model(model_type, hidden_size=64, intermediate_size=128,
                                  num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, vocab_size=96, **overrides)
    return AutoModelForCausalLM.from_config(config).eval()


def decoder_for(*overrides: str, model: torch.nn.Module | None = None,
                decode_compile: str = "cudagraphs", cfg: Any = "compose") -> Any:
    cfg = compose(list(overrides)) if cfg == "compose" else cfg
    return plugin.graft_static_decoder(model=model or tiny_model(), pad_token_id=0,
                                       eos_token_id=2, device=CPU,
                                       decode_compile=decode_compile, cfg=cfg)


def test_the_hook_gives_the_loop_only_where_it_serves() -> None:
    made = decoder_for()
    assert isinstance(made, GraphedDecoder) and not made.use_graphs and not made.fuse_kernels
    assert (made.pad_token_id, made.eos_token_id) == (0, 2)
    assert isinstance(decoder_for(cfg=None), GraphedDecoder)  # built outside a run: defaults
    assert decoder_for("features.graphed_decode.enabled=false") is None
    for other in ("inductor", "none"):  # transformers' compiled or eager step, as asked
        assert decoder_for(decode_compile=other) is None
    windowed = tiny_model("mistral", sliding_window=16)
    assert decoder_for(model=windowed) is None  # transformers' path


def test_the_embedded_engine_decodes_with_the_loop(tmp_path: Path) -> None:
    static = Trainer(compose([f"trainer.run_dir={tmp_path}", *RUN, "rollout.decode=static"]))
    assert isinstance(static.job.rollout.decoder, GraphedDecoder)
    off = Trainer(compose([f"trainer.run_dir={tmp_path / 'off'}", *RUN, "rollout.decode=static",
                           "features.graphed_decode.enabled=false"]))
    assert off.job.rollout.copy is not None and off.job.rollout.decoder is None


class StepRecorder:
    """Records each (step, phase) the plugins' ``graft_compute`` wraps."""

    def __init__(self) -> None:
        self.steps: set[tuple[str, str]] = set()

    @hookimpl(wrapper=True)
    def graft_compute(self, step: str, phase: str) -> Generator[None, Any, Any]:
        self.steps.add((step, phase))
        return (yield)


def test_hook_graft_compute_wraps_every_step_of_the_loop(graft_plugin, tmp_path: Path) -> None:
    recorder = StepRecorder()
    graft_plugin(recorder, name="step_recorder")
    Trainer(compose([f"trainer.run_dir={tmp_path}", *RUN, "rollout.decode=static",
                     "engine.logprob_chunk_tokens=0", "algorithm.old_logprobs=always"])).fit()
    assert recorder.steps == {("prefill", "rollout"), ("decode", "rollout"),
                              ("sample_logprobs", "rollout"), ("forward", "old_logprobs"),
                              ("forward", "update"), ("backward", "update")}


def test_the_loop_decodes_greedily(tmp_path: Path) -> None:
    """Temperature 0 (validation's default): the most likely tokens, no random draw (the core's
    check of transformers' path, tests/core/rollout/test_greedy.py, on the loop)."""
    trainer = greedy_trainer(tmp_path, "rollout.decode=static")
    try:
        assert isinstance(trainer.job.rollout.decoder, GraphedDecoder)
        assert_greedy(trainer)
    finally:
        trainer.job.close()
