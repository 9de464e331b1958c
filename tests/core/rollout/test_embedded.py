"""The embedded rollout engine and the rollout hooks, in process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from graft import hookimpl
from graft.config import compose
from graft.rollout import SamplingSpec
from graft.training.trainer import Trainer


def rl_trainer(tmp_path: Path, *overrides: str) -> Trainer:
    cfg = compose([f"trainer.run_dir={tmp_path}", "trainer.total_steps=2", "engine.device=cpu",
                   "rollout.prompts_per_step=4", "rollout.n=4", "checkpoint.every_steps=0",
                   "export.hf_at_end=false", *overrides])
    return Trainer(cfg)


def test_generation_respects_the_token_cap_and_reports_logprobs(tmp_path: Path) -> None:
    trainer = rl_trainer(tmp_path)
    prompts = [[1, 70, 83], [1, 20, 21, 22, 23]]
    samples = trainer.job.rollout.generate(prompts, SamplingSpec(1.0, 1.0, 6))
    assert [s.prompt_ids for s in samples] == prompts
    for sample in samples:
        assert 1 <= len(sample.response_ids) <= 6 and len(sample.logprobs) == len(sample.response_ids)
        assert (sample.logprobs <= 0).all()
        if len(sample.response_ids) < 6:
            assert sample.response_ids[-1] == trainer.tokenizer.eos_token_id


@pytest.mark.parametrize("decode", ["static", "dynamic"])
def test_generates_logprobs_from_the_logits_dtype_the_trainer_scores(tmp_path: Path, monkeypatch,
                                                                    decode: str) -> None:
    """transformers' ``generate`` hands back fp32 copies of bf16 logits; they are scored cast
    back to bf16, the dtype the trainer's log-probs read (on a GPU the Triton log-prob kernel
    spreads a row over its threads by the width of the dtype it reads, so an fp32 row is summed
    in another order than the same values in bf16)."""
    import graft.rollout.embedded as embedded

    seen: list[torch.dtype] = []
    scored = embedded.token_logprobs

    def recording(logits, labels, temperature):
        seen.append(logits.dtype)
        return scored(logits, labels, temperature)

    monkeypatch.setattr(embedded, "token_logprobs", recording)
    # decode_compile=none: transformers' generate, not a plugin's loop, decodes the static copy
    trainer = rl_trainer(tmp_path, "engine.mixed_precision=bf16", f"rollout.decode={decode}",
                         "rollout.decode_compile=none")
    assert trainer.engine.compute_dtype == torch.bfloat16
    samples = trainer.job.rollout.generate([[1, 70, 83], [1, 20, 21, 22]],
                                           SamplingSpec(1.0, 1.0, 4))
    assert seen and set(seen) == {torch.bfloat16}
    assert all(torch.isfinite(s.logprobs).all() and (s.logprobs <= 0).all() for s in samples)


class RecordingPlugin:
    """Records a per-token extra during rollout, like routing replay does, and checks it
    reaches the training micro-batches."""

    def __init__(self) -> None:
        self.begun = []
        self.seen_extra = []

    @hookimpl
    def graft_rollout_begin(self, engine, model):
        self.begun.append((engine, type(model).__name__))

    @hookimpl
    def graft_rollout_end(self, samples):
        for sample in samples:
            count = len(sample.prompt_ids) + len(sample.response_ids)
            sample.extras["token_marks"] = torch.arange(1, count + 1, dtype=torch.float32)

    @hookimpl
    def graft_prepare_inputs(self, batch, layout):
        marks = batch["token_marks"]
        for segment, values in zip(layout.segments, layout.unpad(marks), strict=True):
            assert values.tolist() == list(range(1, segment.length + 1))
        self.seen_extra.append(tuple(marks.shape))


def test_hook_graft_rollout_begin_sees_the_generating_model(tmp_path: Path, graft_plugin) -> None:
    plugin = RecordingPlugin()
    graft_plugin(plugin, name="recorder")
    rl_trainer(tmp_path).fit()
    assert plugin.begun == [("embedded", "FSDPQwen3MoeForCausalLM")] * 2


def test_hook_graft_rollout_end_extras_reach_the_micro_batches(tmp_path: Path,
                                                               graft_plugin) -> None:
    plugin = RecordingPlugin()
    graft_plugin(plugin, name="recorder")
    rl_trainer(tmp_path, "engine.pad_to_length=true", "engine.pad_to_length_bucket=64").fit()
    assert plugin.seen_extra and all(shape[1] % 64 == 0 for shape in plugin.seen_extra)


@pytest.mark.slow
def test_static_decode_samples_exactly_what_the_trained_model_would(graft_train, metrics_of,
                                                                   tmp_path: Path) -> None:
    """The static-cache copy (fp32 on CPU, as the trainer computes here) draws the same tokens
    from the same generator state: same rewards, lengths and losses as the sharded model (on
    2 ranks, where the copy is refreshed from shards)."""
    nproc = 2
    args = ("trainer.total_steps=3", "rollout.prompts_per_step=4", "rollout.n=4",
            "checkpoint.every_steps=0", "export.hf_at_end=false")
    graft_train(tmp_path / "dynamic", *args, nproc=nproc)
    graft_train(tmp_path / "static", *args, "rollout.decode=static", nproc=nproc)
    for a, b in zip(metrics_of(tmp_path / "dynamic"), metrics_of(tmp_path / "static"),
                    strict=True):
        assert (a["reward_mean"], a["response_length"]) == (b["reward_mean"], b["response_length"])
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-8)
        assert b["train_infer_logprob_diff"] < 1e-5


class FixedDecoder:
    """A decode loop of the test's own: every row gets ``tokens`` with log-prob -0.5 each."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens
        self.calls: list[tuple[int, int]] = []  # (batch, prompt length) per generate

    def generate(self, ids: torch.Tensor, mask: torch.Tensor,
                 spec: SamplingSpec) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls.append(tuple(ids.shape))
        tokens = torch.tensor([self.tokens] * ids.shape[0], device=ids.device)
        return tokens, torch.full(tokens.shape, -0.5, device=ids.device)


class SuppliesADecoder:
    """``graft_static_decoder``: records its arguments and returns a `FixedDecoder`."""

    def __init__(self) -> None:
        self.seen: list[dict] = []
        self.decoder = FixedDecoder([40, 41, 42])

    @hookimpl
    def graft_static_decoder(self, model, pad_token_id, eos_token_id, device, decode_compile,
                             cfg):
        self.seen.append(dict(model=model, pad=pad_token_id, eos=eos_token_id, device=device,
                              decode_compile=decode_compile, cfg=cfg))
        return self.decoder


def test_hook_graft_static_decoder_supplies_the_static_copys_loop(tmp_path: Path,
                                                                  graft_plugin) -> None:
    """The static copy samples with the plugin's decoder (no graft-graphed-decode needed), which
    gets the copy, the tokenizer's pad and EOS, the device, ``rollout.decode_compile`` and the
    run's config; the dynamic decode never asks."""
    plugin = SuppliesADecoder()
    graft_plugin(plugin, name="fixed-decoder")
    trainer = rl_trainer(tmp_path, "rollout.decode=static", "rollout.decode_compile=inductor")
    rollout = trainer.job.rollout
    (seen,) = plugin.seen
    assert rollout.decoder is plugin.decoder and seen["model"] is rollout.copy.model
    assert (seen["pad"], seen["eos"]) == (trainer.tokenizer.pad_token_id,
                                          trainer.tokenizer.eos_token_id)
    assert seen["device"].type == "cpu" and seen["decode_compile"] == "inductor"
    assert seen["cfg"].rollout.decode == "static"
    samples = rollout.generate([[1, 70, 83], [1, 20, 21, 22]], SamplingSpec(1.0, 1.0, 3))
    assert plugin.decoder.calls == [(2, 4)]  # one left-padded batch
    assert [s.response_ids for s in samples] == [[40, 41, 42]] * 2
    assert all(s.logprobs.tolist() == [-0.5] * 3 for s in samples)
    rl_trainer(tmp_path / "dynamic", "rollout.decode=dynamic")
    assert len(plugin.seen) == 1


def test_a_plugins_boolean_mask_attention_is_listed_for_decode_loops(monkeypatch) -> None:
    """`register_boolean_mask_attention` (graft-exact's attention) is what a decode loop reads
    back with `boolean_mask_attentions` (graft-graphed-decode's), with no plugin between."""
    import graft.rollout

    monkeypatch.setattr(graft.rollout, "_BOOLEAN_MASK_ATTENTIONS", set())
    assert graft.rollout.boolean_mask_attentions() == frozenset()
    graft.rollout.register_boolean_mask_attention("my_masked_attention")
    graft.rollout.register_boolean_mask_attention("my_masked_attention")  # idempotent
    assert graft.rollout.boolean_mask_attentions() == {"my_masked_attention"}
