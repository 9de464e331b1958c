"""Which calls of a decoder block `compile_decoder_blocks` routes to the compiled forward: a
decode step inside `compiled_blocks`, each block with its own cache layer; never the prefill, a
cache's first write, or a call outside the context (the trainer's forward, an eager decoder)."""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM, StaticCache

from graft.models.family import standard_decoder_blocks
from graft_graphed_decode import regional_compile
from graft_graphed_decode.regional_compile import compile_decoder_blocks, compiled_blocks


def tiny_llama() -> torch.nn.Module:
    config = AutoConfig.for_model("llama", hidden_size=64, intermediate_size=128,
                                  num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, vocab_size=64)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def route_recording(monkeypatch, model: torch.nn.Module) -> list[tuple[int, object]]:
    """Route the model's blocks with ``torch.compile`` replaced by a recorder that runs the
    eager function: (block index, the cache it was given) per compiled call."""
    calls: list[tuple[int, object]] = []
    blocks = standard_decoder_blocks(model)

    def recording_compile(function, **_):
        def compiled(block, *args, **kwargs):
            cache = next(v for k, v in kwargs.items() if k in ("past_key_values", "cache"))
            calls.append((blocks.index(block), cache))
            return function(block, *args, **kwargs)
        return compiled

    monkeypatch.setattr(regional_compile.torch, "compile", recording_compile)
    compile_decoder_blocks(blocks)
    compile_decoder_blocks(blocks)  # a second decoder: nothing routed twice
    return calls


@torch.no_grad()
def test_only_decode_steps_inside_the_context_run_compiled(monkeypatch) -> None:
    model = tiny_llama()
    calls = route_recording(monkeypatch, model)
    cache = StaticCache(config=model.config, max_cache_len=16)
    ids = torch.tensor([[3, 4, 5]])
    with compiled_blocks():
        prefill = model(input_ids=ids, past_key_values=cache, use_cache=True)
    assert calls == []  # the prefill (three positions), which also allocates the cache
    token = prefill.logits[:, -1:].argmax(-1)
    position = torch.tensor([[3]])
    model(input_ids=token, position_ids=position, past_key_values=cache, use_cache=True)
    with compiled_blocks(False):  # a decoder that does not fuse
        model(input_ids=token, position_ids=position, past_key_values=cache, use_cache=True)
    assert calls == []
    with compiled_blocks():
        model(input_ids=token, position_ids=position, past_key_values=cache, use_cache=True)
    assert [index for index, _ in calls] == [0, 1]
    assert [narrowed.layer for _, narrowed in calls] == list(cache.layers)


@torch.no_grad()
def test_the_routed_blocks_give_the_eager_models_logits(monkeypatch) -> None:
    """The narrowed cache writes each block's keys where the block's own ``layer_idx`` would."""
    eager, routed = tiny_llama(), tiny_llama()
    route_recording(monkeypatch, routed)
    logits = []
    for model, context in ((eager, compiled_blocks(False)), (routed, compiled_blocks())):
        cache = StaticCache(config=model.config, max_cache_len=16)
        token = model(input_ids=torch.tensor([[3, 4, 5]]), past_key_values=cache,
                      use_cache=True).logits[:, -1:].argmax(-1)
        steps = []
        with context:
            for position in range(3, 8):
                out = model(input_ids=token, position_ids=torch.tensor([[position]]),
                            past_key_values=cache, use_cache=True).logits[:, -1]
                token = out.argmax(-1, keepdim=True)
                steps.append(out)
        logits.append(torch.stack(steps))
    assert torch.equal(logits[0], logits[1])
