"""Graft's own static-cache decode loop (``rollout.decode_compile=cudagraphs``), on CPU: the same
step it replays from a CUDA graph on a GPU, run eagerly."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from graft.rollout import SamplingSpec
from graft_graphed_decode.decoder import GraphedDecoder, _top_p, decodes_with_graphs

PAD = 0
CPU = torch.device("cpu")


def tiny_llama(attention: str, vocab_size: int = 96) -> torch.nn.Module:
    config = AutoConfig.for_model("llama", hidden_size=64, intermediate_size=128,
                                  num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, vocab_size=vocab_size,
                                  attn_implementation=attention)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def assert_own_log_probs(model, prompts, tokens, logprobs, temperature: float,
                         eos: int | None = None) -> None:
    """Each row's log-probs are those of one unpadded forward of its whole sequence (no cache),
    up to its EOS; after it, padding with log-prob 0."""
    for prompt, row, row_logprobs in zip(prompts, tokens, logprobs, strict=True):
        end = row.tolist().index(eos) + 1 if eos in row.tolist() else len(row)
        sequence = torch.tensor([prompt + row[:end].tolist()])
        with torch.no_grad():
            logits = model(input_ids=sequence).logits[0, len(prompt) - 1:-1].float() / temperature
        expected = logits.log_softmax(-1).gather(-1, row[:end, None]).squeeze(-1)
        torch.testing.assert_close(row_logprobs[:end], expected, rtol=0, atol=2e-5)
        assert (row[end:] == PAD).all() and (row_logprobs[end:] == 0).all()


def left_pad(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_log_probs_are_the_models_own_for_every_left_padded_row(attention: str) -> None:
    model = tiny_llama(attention)
    assert decodes_with_graphs(model)
    prompts = [[5, 6, 7, 8, 9], [11, 12], [20, 21, 22]]
    decoder = GraphedDecoder(model, pad_token_id=PAD, eos_token_id=None, use_graphs=False)
    torch.manual_seed(1)
    # 5 + 70 cache slots: the steps attend to 64 slots, then to 128 (SDPA)
    tokens, logprobs = decoder.generate(*left_pad(prompts), SamplingSpec(0.8, 1.0, 70))
    assert tokens.shape == logprobs.shape == (3, 70)
    assert_own_log_probs(model, prompts, tokens, logprobs, 0.8)
    if attention == "sdpa":  # decode steps attend with grouped queries
        assert model.config._attn_implementation == "graft_grouped_query_decode"
        # a second decoder over the switched model keeps them (it fell back to additive masks
        # over the whole cache and transformers' per-head key copies: 5.7x slower on an H200)
        assert decodes_with_graphs(model)
        again = GraphedDecoder(model, pad_token_id=PAD, eos_token_id=None, use_graphs=False)
        assert again.boolean_mask and again._attended_lengths(320) == [64, 128, 192, 256, 320]


def test_finished_rows_leave_the_batch_and_the_others_keep_their_own_log_probs() -> None:
    model = tiny_llama("sdpa", vocab_size=12)
    eos = 3  # one token in 12: most rows end within a few dozen steps
    prompts = [[5 + i % 6, 6, 7 + i % 3][: 1 + i % 3] for i in range(16)]
    decoder = GraphedDecoder(model, pad_token_id=PAD, eos_token_id=eos, use_graphs=False,
                             check_every=2, min_batch=2)
    torch.manual_seed(4)
    tokens, logprobs = decoder.generate(*left_pad(prompts), SamplingSpec(1.5, 1.0, 48))
    assert len(decoder.batch_sizes) > 2 and decoder.batch_sizes[0] == 16
    assert decoder.batch_sizes == sorted(decoder.batch_sizes, reverse=True)
    assert_own_log_probs(model, prompts, tokens, logprobs, 1.5, eos=eos)
    # one cache: every smaller batch's rows are the first rows of the full batch's
    (full_batch, _), full = max(decoder._states.items(), key=lambda item: item[0])
    assert full_batch == 16 and len(decoder._states) > 2
    for (batch, _), state in decoder._states.items():
        for layer, full_layer in zip(state.cache.layers, full.cache.layers, strict=True):
            assert layer.keys.shape[0] == batch and layer.values.shape[0] == batch
            assert layer.keys.data_ptr() == full_layer.keys.data_ptr()
            assert layer.values.data_ptr() == full_layer.values.data_ptr()


@pytest.mark.slow
def test_the_fused_step_samples_what_the_eager_step_does_as_the_batch_shrinks() -> None:
    """bf16, where fusing without emulate_precision_casts would round differently (on CPU too):
    the compiled step gives the eager step's tokens and log-probs bit for bit, from one
    (dynamic-shape) compiled block graph for every decoder block, batch size and attended
    length (`graft_graphed_decode.regional_compile`: each block's cache write goes to its own layer)."""
    from torch._dynamo.utils import counters

    model = tiny_llama("sdpa", vocab_size=48).to(torch.bfloat16)
    prompts = [[5 + i % 6, 6, 7 + i % 3][: 1 + i % 3] for i in range(8)]
    outputs = []
    compiled_before = counters["stats"]["unique_graphs"]
    for fuse in (False, True):
        decoder = GraphedDecoder(model, pad_token_id=PAD, eos_token_id=3, use_graphs=False,
                                 fuse_kernels=fuse, check_every=2, min_batch=2)
        torch.manual_seed(4)
        outputs.append((*decoder.generate(*left_pad(prompts), SamplingSpec(1.5, 1.0, 80)),
                        decoder.batch_sizes))
    (tokens, logprobs, sizes), (fused_tokens, fused_logprobs, fused_sizes) = outputs
    assert counters["stats"]["unique_graphs"] - compiled_before == 1
    assert len(sizes) > 2 and fused_sizes == sizes
    assert tokens.shape[1] > 64  # past the first attended length (64 cache slots)
    assert torch.equal(fused_tokens, tokens) and torch.equal(fused_logprobs, logprobs)


def test_a_finished_row_is_padded_and_the_others_run_on() -> None:
    model = tiny_llama("sdpa")
    ids, mask = left_pad([[5, 6, 7], [30, 31, 32]])
    spec = SamplingSpec(1.0, 1.0, 40)
    torch.manual_seed(2)
    first, _ = GraphedDecoder(model, pad_token_id=PAD, eos_token_id=None,
                              use_graphs=False).generate(ids, mask, spec)
    eos = int(first[0, 2])  # row 0 emits it at step 3 with the same generator state
    decoder = GraphedDecoder(model, pad_token_id=PAD, eos_token_id=eos, use_graphs=False,
                             check_every=1)
    torch.manual_seed(2)
    tokens, logprobs = decoder.generate(ids, mask, spec)
    end = first[0].tolist().index(eos)
    assert tokens[0, :end + 1].tolist() == first[0, :end + 1].tolist()
    assert (tokens[0, end + 1:] == PAD).all() and (logprobs[0, end + 1:] == 0).all()
    assert eos not in first[1].tolist()  # row 1 never ends: it runs on, sampled as before
    assert torch.equal(tokens[1], first[1]) and tokens.shape == (2, 40)


def test_one_row_that_finishes_stops_the_loop() -> None:
    model = tiny_llama("sdpa")
    ids, mask = left_pad([[5, 6, 7]])
    torch.manual_seed(3)
    first, _ = GraphedDecoder(model, pad_token_id=PAD, eos_token_id=None,
                              use_graphs=False).generate(ids, mask, SamplingSpec(1.0, 1.0, 4))
    decoder = GraphedDecoder(model, pad_token_id=PAD, eos_token_id=int(first[0, 0]),
                             use_graphs=False, check_every=1)
    torch.manual_seed(3)
    tokens, _ = decoder.generate(ids, mask, SamplingSpec(1.0, 1.0, 30))
    assert tokens.tolist() == [[int(first[0, 0])]]


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    scores = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    kept = _top_p(scores, 0.7).isfinite()
    assert kept.tolist() == [[True, True, False, False]]
    assert _top_p(scores, 0.1).isfinite().tolist() == [[True, False, False, False]]


def test_sampling_draws_what_torch_multinomial_draws_from_the_same_generator_state() -> None:
    decoder = GraphedDecoder(tiny_llama("sdpa"), pad_token_id=PAD, eos_token_id=3,
                             use_graphs=False)
    logits = torch.randn(64, 96, generator=torch.Generator().manual_seed(0)).bfloat16()
    finished = torch.zeros(64, dtype=torch.bool)
    finished[:4] = True
    torch.manual_seed(7)
    token, logprob = decoder._sample(logits, SamplingSpec(0.7, 1.0, 8), finished.clone())
    torch.manual_seed(7)
    expected = torch.multinomial(torch.softmax(logits.float() / 0.7, dim=-1), 1).squeeze(1)
    assert torch.equal(token[4:], expected[4:]) and (token[:4] == PAD).all()
    assert (logprob[:4] == 0).all() and (logprob[4:] < 0).all()


def test_a_rollout_of_another_cache_length_lets_the_old_graphs_and_their_pool_go() -> None:
    """CUDA refuses a capture into a pool whose graphs are all gone (a GPU check, in
    bench/gpu/graphed_decode_check.py, runs two lengths); here a stand-in marks the graphs."""
    decoder = GraphedDecoder(tiny_llama("sdpa"), pad_token_id=PAD, eos_token_id=None,
                             use_graphs=False)
    short = left_pad([[5, 6, 7]])
    decoder.generate(*short, SamplingSpec(1.0, 1.0, 8))  # a 64-slot cache
    for state in decoder._states.values():
        state.graphs[-1] = "captured"  # a length no step attends to: never replayed
    decoder._graph_pool = "pool"
    decoder.generate(*short, SamplingSpec(1.0, 1.0, 8))  # the same length keeps both
    assert decoder._graph_pool == "pool"
    decoder.generate(*short, SamplingSpec(1.0, 1.0, 100))  # a 128-slot cache
    assert decoder._graph_pool is None
    assert {length for _, length in decoder._states} == {128}


def test_a_shorter_rollout_replays_the_prepared_states_of_a_longer_one() -> None:
    """A validation's rollout (or a step of shorter prompts) between training steps decodes in
    the training's cache and graphs: letting them go made the next step capture and compile them
    all again (a slow step after each validation)."""
    model = tiny_llama("sdpa")
    decoder = GraphedDecoder(model, pad_token_id=PAD, eos_token_id=None, use_graphs=False)
    long_prompts = [[5 + i, 6, 7, 8, 9, 10][: 2 + i % 5] for i in range(8)]
    decoder.generate(*left_pad(long_prompts), SamplingSpec(1.0, 1.0, 100))  # 128 slots
    prepared = dict(decoder._states)
    assert {length for _, length in prepared} == {128}
    short = [[11, 12], [13, 14, 15]]
    torch.manual_seed(2)
    tokens, logprobs = decoder.generate(*left_pad(short), SamplingSpec(0.9, 1.0, 40))  # 64 needed
    assert_own_log_probs(model, short, tokens, logprobs, 0.9)
    assert all(decoder._states[key] is state for key, state in prepared.items())
    assert {length for _, length in decoder._states} == {128}
    decoder.generate(*left_pad(long_prompts), SamplingSpec(1.0, 1.0, 100))
    assert all(decoder._states[key] is state for key, state in prepared.items())
    decoder.generate(*left_pad(long_prompts), SamplingSpec(1.0, 1.0, 150))  # 192: they go
    assert {length for _, length in decoder._states} == {192}
    # a cache over twice as long as needed is memory spent on nothing: it goes too
    decoder.generate(*left_pad(short), SamplingSpec(1.0, 1.0, 8))
    assert {length for _, length in decoder._states} == {64}


def test_sliding_window_models_keep_transformers_path() -> None:
    config = AutoConfig.for_model("mistral", hidden_size=64, intermediate_size=128,
                                  num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, vocab_size=96, sliding_window=16)
    assert not decodes_with_graphs(AutoModelForCausalLM.from_config(config))


@pytest.mark.slow
def test_graft_train_with_the_graphed_loop_matches_its_own_log_probs(graft_train, metrics_of,
                                                                     tmp_path: Path) -> None:
    graft_train(tmp_path, "trainer.total_steps=2", "rollout.prompts_per_step=4", "rollout.n=4",
                "checkpoint.every_steps=0", "export.hf_at_end=false", "rollout.decode=static",
                "rollout.decode_compile=cudagraphs")
    metrics = metrics_of(tmp_path)
    assert len(metrics) == 2
    assert all(m["train_infer_logprob_diff"] < 1e-5 for m in metrics)


def test_the_loop_passes_its_cache_by_the_installed_transformers_keyword() -> None:
    # transformers 5.24 renamed forward's past_key_values to cache (the old name warns until
    # 5.40, then fails): the loop must use whichever the model takes, with no warning
    model = tiny_llama("sdpa")
    decoder = GraphedDecoder(model, pad_token_id=PAD, eos_token_id=None, use_graphs=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        tokens, _ = decoder.generate(*left_pad([[5, 6, 7]]), SamplingSpec(1.0, 1.0, 4))
    assert tokens.shape == (1, 4)


def test_seeded_rows_draw_the_cores_tokens_alone_or_in_a_shrinking_batch() -> None:
    """``SamplingSpec.seeds``: each row is drawn by the core's seeded draw (`graft.rollout.
    seeded_scores`, keyed by its seed and position), never from torch's generator: the same
    tokens alone as in a batch whose finished rows leave it, and transformers' ``generate``
    with the core's `SeededSampler` draws them too."""
    from graft.rollout.seeded import SeededSampler

    model = tiny_llama("sdpa", vocab_size=12)
    eos = 3
    prompts = [[5 + i % 6, 6, 7 + i % 3][: 1 + i % 3] for i in range(12)]
    seeds = tuple(1000 + 7 * i for i in range(12))
    spec = SamplingSpec(1.5, 0.9, 24, seeds=seeds)
    decoder = GraphedDecoder(model, pad_token_id=PAD, eos_token_id=eos, use_graphs=False,
                             check_every=2, min_batch=2)
    torch.manual_seed(4)
    tokens, logprobs = decoder.generate(*left_pad(prompts), spec)
    assert len(decoder.batch_sizes) > 2  # rows left the batch as they finished
    assert len({tuple(row) for row in tokens.tolist()}) > 6
    assert_own_log_probs(model, prompts, tokens, logprobs, 1.5, eos=eos)
    for row in (0, 4, 11):
        torch.manual_seed(99)  # the generator's state must not matter
        alone, _ = decoder.generate(*left_pad([prompts[row]]),
                                    SamplingSpec(1.5, 0.9, 24, seeds=(seeds[row],)))
        assert alone[0].tolist() == tokens[row, :alone.shape[1]].tolist()
        assert (tokens[row, alone.shape[1]:] == PAD).all()
        sampler = SeededSampler((seeds[row],), temperature=1.5, top_p=0.9, device=CPU)
        with torch.no_grad():
            core = model.generate(torch.tensor([prompts[row]]), do_sample=False,
                                  max_new_tokens=24, logits_processor=[sampler],
                                  eos_token_id=eos, pad_token_id=PAD)[0, len(prompts[row]):]
        assert core.tolist() == alone[0, :core.shape[0]].tolist()
