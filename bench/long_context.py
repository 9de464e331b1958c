"""Long sequences on one GPU: peak memory and step time of an 8B-class model with the real loss.

Model: transformers ``LlamaForCausalLM`` with Llama-3-8B shapes (hidden 4096, MLP 14336, 32
layers, 32 heads / 8 KV heads of 128, vocab 128,256), bf16 random weights on the meta device
materialised on the GPU (as bench/offload.py), one plain module, weight gradients dropped as
they are accumulated (as FSDP2 frees them after its reduce-scatter). A step is the forward and
backward of one sequence with the real loss: the mean log-prob of every position's label
(temperature 1), no optimizer step.

Variants, each built from the core's own pieces:
  ``today``          per-block activation checkpointing, the whole logits, ``token_logprobs``
                     (``engine.logprob_chunk_tokens=0``)
  ``chunked``        + log-probs from the hidden states in chunks (`graft.engine.head.chunked`,
                     ``--logprob-chunk`` tokens, the default of ``engine.logprob_chunk_tokens``)
  ``fused``          chunked, the loss's gradient taken in the head's forward
                     (`graft.engine.head.fused_loss`, ``engine.fuse_loss_into_head``, the default:
                     no logits recomputed in backward); ``fused+...`` with the pieces below
  ``chunked+offload``   + graft-offload on the 32 blocks (its defaults; skipped when the
                     plugin is not installed)
  ``chunked+tiled``     + tiled MLP (graft-activation-memory's `graft_activation_memory.tiled_mlp`,
                     ``--mlp-chunk`` tokens; skipped, like the norms, when the plugin is not
                     installed)
  ``chunked+tiled+norms``   + the blocks' norms recomputed in backward
                     (`graft_activation_memory.recomputed_norms`)
  ``chunked+tiled+groups``  + ``--every`` blocks per checkpoint (`graft.engine.checkpoint_groups`:
                     two-level, each block of a group checkpointed again in its replay)
  ``chunked+offload+tiled`` / ``chunked+offload+tiled+norms`` /
  ``chunked+offload+tiled+norms+groups``: the pieces together
  ``liger``          Liger-Kernel's ``LigerFusedLinearCrossEntropyLoss`` on the hidden states
                     (when importable; not a dependency)

Peak GiB at 8K / 32K / 64K / 128K per variant (a length that runs out of memory is recorded as
such and the variant's longer lengths skipped), step time at 8K and 32K (one warm-up step, then
``--steps``), the slope in GiB per 1K tokens and the fixed GiB from a least-squares line through
each variant's peaks, the same line through the host memory the offload holds (its pool after the
step), the largest length that fits both the GPU and ``--host-limit-gb`` of host memory
extrapolated from them, and one confirmed
run of the best variant at the longest length that fits both the extrapolation and the time left
(``--budget-s``; attention is quadratic). The result names them ``largest_tokens_extrapolated``
and ``confirmed_tokens``.

    python bench/long_context.py --out $OUT/long_context.json          # one H200
    python bench/long_context.py --variants chunked+offload+tiled+groups --lengths 65536 131072 \
        --timed-lengths 0 --out $OUT/long_context_confirm.json   # the confirmed long run
    python bench/long_context.py --tiny --device cpu --out /tmp/lc.json   # CPU smoke test
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib.util
import json
import sys
import time
import traceback

import torch
from long_context_memory import PhasePeaks, fit_line
from long_context_timing import compare_times, interleaved_times, step_seconds

SHAPES_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
             "vocab_size": 128256, "max_position_embeddings": 1 << 20}
SHAPES_TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
               "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
               "vocab_size": 512, "max_position_embeddings": 8192}
LENGTHS = (8192, 32768, 65536, 131072)
TINY_LENGTHS = (128, 256, 384, 512)
VARIANTS = ("today", "chunked", "fused", "liger", "chunked+offload+tiled",
            "chunked+offload+tiled+norms", "chunked+offload+tiled+norms+groups")


def build_model(shapes: dict, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """Random weights on ``device`` (meta first, so an 8B model needs no host copy)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("llama", **shapes, tie_word_embeddings=False, use_cache=False)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.to_empty(device=device)
    generator = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.fill_(1.0) if "norm" in name else param.normal_(0.0, 0.02, generator=generator)
    with torch.device(device):  # to_empty left the rotary buffers uninitialised: rebuild them
        model.model.rotary_emb = type(model.model.rotary_emb)(model.config)
    for param in model.parameters():
        param.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))
    return model.train()


class Layout:
    """Switches one model between the variants' memory layouts, in place."""

    def __init__(self, model: torch.nn.Module, device: torch.device, tiny: bool,
                 host_limit_bytes: int) -> None:
        self.model, self.device, self.tiny = model, device, tiny
        self.host_limit_bytes = host_limit_bytes
        self.blocks = list(model.model.layers)
        self.offloader = None
        self.routed = False

    def offload_available(self) -> bool:
        return importlib.util.find_spec("graft_offload") is not None

    def memory_available(self) -> bool:
        return importlib.util.find_spec("graft_activation_memory") is not None

    def use(self, *, offload: bool, mlp_chunk: int, every: int, norms: bool) -> None:
        """Per-block (``every`` 1) or grouped checkpoints, the MLP tiled or whole, the norms
        recomputed or not, the blocks routed through graft-offload or not."""
        from graft.engine.checkpoint_groups import GROUP_ATTRIBUTE, apply_checkpoint_groups

        patched = [(block, GROUP_ATTRIBUTE) for block in self.blocks]
        if self.memory_available():
            from graft_activation_memory.recomputed_norms import (
                RECOMPUTED_ATTRIBUTE,
                apply_recomputed_norms,
                block_norms,
                final_norm,
            )
            from graft_activation_memory.tiled_mlp import TILED_ATTRIBUTE, apply_tiled_mlp

            patched += [(block.mlp, TILED_ATTRIBUTE) for block in self.blocks]
            norms_of = [*self.blocks, *final_norm(self.model)]
            patched += [(norm, RECOMPUTED_ATTRIBUTE) for norm in block_norms(norms_of)]
        for module, attribute in patched:  # back to plain blocks, MLPs and norms
            if hasattr(module, attribute):
                delattr(module, attribute)
                del module.forward
        self.model.gradient_checkpointing_disable()
        self._route(offload)
        if every > 1:
            apply_checkpoint_groups(self.blocks, every)
        else:
            self.model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        if mlp_chunk:
            apply_tiled_mlp(self.blocks, mlp_chunk)
        if norms:
            apply_recomputed_norms(norms_of)

    def _route(self, offload: bool) -> None:
        if not offload and self.offloader is None:
            return
        from graft_offload.patching import route_calls, unroute_calls
        from graft_offload.runtime import apply_offload

        if self.offloader is None:
            backend = None
            if self.tiny or self.device.type != "cuda":
                from graft_offload.standin import DeferredCopyBackend

                backend = DeferredCopyBackend()
            self.offloader = apply_offload(
                [(f"model.layers.{i}", b) for i, b in enumerate(self.blocks)], device=self.device,
                backend=backend, min_tensor_bytes=0 if self.tiny else 2**20,
                host_cache_limit_bytes=self.host_limit_bytes)
            self.routed = True
        if offload != self.routed:
            route_calls(self.blocks, self.offloader) if offload else unroute_calls(self.blocks)
            self.routed = offload


def loss_of(model: torch.nn.Module, ids: torch.Tensor, variant: str,
            logprob_chunk: int) -> torch.Tensor:
    """Minus the mean log-prob of every position's label (the next token; the last position's
    label wraps to the first token, so every position has one)."""
    from graft.engine.forward import head_inputs, head_parameters
    from graft.engine.head.chunked import chunked_head_logprobs
    from graft.engine.head.fused_loss import fused_head_loss
    from graft.engine.head.logprobs import token_logprobs

    labels = ids.roll(-1, dims=1)
    if variant == "today":
        logits = model(input_ids=ids, use_cache=False).logits
        return -token_logprobs(logits, labels).mean()
    with head_inputs(model) as captured:
        model(input_ids=ids, use_cache=False)
    hidden = captured["hidden"]
    if variant == "liger":
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        return LigerFusedLinearCrossEntropyLoss()(model.lm_head.weight,
                                                  hidden.reshape(-1, hidden.shape[-1]),
                                                  labels.reshape(-1))
    if variant.startswith("fused"):
        count = labels.numel()
        _, _, loss = fused_head_loss(model.lm_head, hidden, labels, None,
                                     lambda _tokens, logp: -logp.sum() / count,
                                     chunk_tokens=logprob_chunk, params=head_parameters(model))
        return loss
    logp, _ = chunked_head_logprobs(model.lm_head, hidden, labels, None,
                                    chunk_tokens=logprob_chunk, params=head_parameters(model))
    return -logp.mean()


def layout_of(variant: str, args: argparse.Namespace) -> dict:
    return {"offload": "offload" in variant,
            "mlp_chunk": args.mlp_chunk if "tiled" in variant else 0,
            "every": args.every if "groups" in variant else 1, "norms": "norms" in variant}


def available(variant: str, layout: Layout) -> str | None:
    """Why ``variant`` cannot run here, or None."""
    if "offload" in variant and not layout.offload_available():
        return "graft-offload not installed"
    if ("tiled" in variant or "norms" in variant) and not layout.memory_available():
        return "graft-activation-memory not installed"
    if variant == "liger" and importlib.util.find_spec("liger_kernel") is None:
        return "liger-kernel not importable"
    if variant == "liger" and layout.device.type != "cuda":
        return "liger-kernel needs a GPU (Triton)"
    return None


def host_memory_gib() -> float:
    """The host's physical memory, GiB."""
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(layout: Layout, variant: str, tokens: int, args: argparse.Namespace,
            timed: bool) -> dict:
    """One row: peak GPU memory of a step (and its time, after a warm-up, when ``timed``)."""
    device, vocab = layout.device, layout.model.config.vocab_size
    layout.use(**layout_of(variant, args))
    ids = torch.randint(0, vocab, (1, tokens), device=device,
                        generator=torch.Generator(device=device).manual_seed(tokens))
    cuda = device.type == "cuda"
    if layout.offloader is not None and layout.routed:
        layout.offloader.pool.close()  # a fresh pool: its size after the step is this step's

    losses: list[torch.Tensor] = []
    offload_metrics: list[dict[str, float]] = []
    peaks: list[tuple[str, float]] = []
    overall: list[float] = []

    def step() -> None:
        if layout.offloader is not None and layout.routed:
            layout.offloader.begin_step()
        with PhasePeaks(layout.blocks, cuda) as phases:
            loss = loss_of(layout.model, ids, variant, args.logprob_chunk)
            phases.backward_starts()
            loss.backward()
        peaks[:] = phases.peaks
        overall.append(phases.overall_gib)
        losses.append(loss.detach())
        if layout.offloader is not None and layout.routed:
            if not cuda:
                layout.offloader.backend.synchronize()
            offload_metrics.append(layout.offloader.end_step())

    if timed:
        step()
    sync(device)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    steps = args.steps if timed else 1
    started = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    seconds = (time.perf_counter() - started) / steps
    row = {"variant": variant, "tokens": tokens, "status": "ok", **layout_of(variant, args),
           "peak_gib": round(max(overall), 3) if cuda else None,
           "loss": float(losses[-1])}  # the same ids at a length: every variant's should agree
    if layout.offloader is not None and layout.routed:
        # the pool keeps what it allocated: its size after the step is the step's peak
        row["host_gib"] = round(layout.offloader.pool.held_bytes / 2**30, 3)
        row["offload_metrics"] = {k.removeprefix("offload/"): round(v, 3)
                                  for k, v in offload_metrics[-1].items()}
    if peaks:  # where the backward's peak is: the head (and final norm), then each block
        blocks = peaks[1:]
        top = max(blocks, key=lambda p: p[1]) if blocks else (None, None)
        row["backward_peaks_gib"] = {"head": peaks[0][1], "blocks_max": top[1],
                                     "block_of_max": top[0]}
    if timed:
        row.update(step_s=round(seconds, 4), tokens_per_s=round(tokens / seconds))
    return row


def one_step(layout: Layout, args: argparse.Namespace, variant: str, ids: torch.Tensor) -> None:
    """Forward and backward of ``ids`` in ``variant``'s layout (no memory accounting)."""
    layout.use(**layout_of(variant, args))
    loss_of(layout.model, ids, variant, args.logprob_chunk).backward()


def run(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    shapes = SHAPES_TINY if args.tiny else SHAPES_8B
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    started = time.perf_counter()
    model = build_model(shapes, device, dtype)
    layout = Layout(model, device, args.tiny, int(args.host_limit_gb * 2**30))
    lengths = tuple(args.lengths) if args.lengths else TINY_LENGTHS if args.tiny else LENGTHS
    capacity = (torch.cuda.get_device_properties(device).total_memory / 2**30 * args.usable
                if device.type == "cuda" else None)
    rows: list[dict] = []
    for variant in args.variants:
        reason = available(variant, layout)
        if reason:
            rows.append({"variant": variant, "status": f"skipped ({reason})"})
            print(json.dumps(rows[-1]), flush=True)
            continue
        for index, tokens in enumerate(lengths):
            if time.perf_counter() - started > args.budget_s * 0.7:
                rows.append({"variant": variant, "tokens": tokens, "status": "skipped (budget)"})
                continue
            try:
                rows.append(measure(layout, variant, tokens, args,
                                    timed=index < args.timed_lengths))
            except torch.OutOfMemoryError:
                rows.append({"variant": variant, "tokens": tokens, "status": "oom"})
            except Exception as exc:  # a variant that breaks is recorded, the others still run
                rows.append({"variant": variant, "tokens": tokens,
                             "status": f"error: {type(exc).__name__}: {exc}"[:500]})
                traceback.print_exc()
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            print(json.dumps(rows[-1]), flush=True)
            with open(args.out, "w") as f:  # what a time limit would otherwise lose
                json.dump({"partial": True, "rows": rows}, f, indent=1)
            if rows[-1]["status"] != "ok":
                break
    fits = [f for f in (fit_line(rows, v, capacity or 0.0, args.host_limit_gb)
                        for v in args.variants) if f]
    result = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
              "shapes": shapes, "device": str(device), "dtype": str(dtype),
              "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
              "capacity_gib": capacity, "logprob_chunk_tokens": args.logprob_chunk,
              "mlp_chunk_tokens": args.mlp_chunk, "checkpoint_every_blocks": args.every,
              "host_limit_gib": args.host_limit_gb, "host_memory_gib": host_memory_gib(),
              "rows": rows, "fits": fits}
    result.update(compare_times(rows))
    if args.interleave_rounds:
        result.update(interleaved_times(
            functools.partial(one_step, layout, args), rows, lengths=lengths[:args.timed_lengths],
            rounds=args.interleave_rounds, vocab=layout.model.config.vocab_size, device=device))
    if capacity is not None and fits and args.confirm:
        result.update(confirm(layout, rows, fits, args, started, lengths))
    return result


def confirm(layout: Layout, rows: list[dict], fits: list[dict], args: argparse.Namespace,
            started: float, lengths: tuple[int, ...]) -> dict:
    """One run of the variant that extrapolates longest, at ``--confirm-tokens`` or else the
    longest multiple of 8K within both its extrapolation and the time left."""
    best = max(fits, key=lambda f: f["largest_tokens_extrapolated"] or 0)
    if args.confirm_variant:
        best = next(f for f in fits if f["variant"] == args.confirm_variant)
    tokens = (best["largest_tokens_extrapolated"] or 0) // 8192 * 8192
    left = args.budget_s - (time.perf_counter() - started)
    if args.confirm_tokens:
        tokens = args.confirm_tokens
    while tokens > lengths[-1] and not args.confirm_tokens:
        estimate = step_seconds(rows, best["variant"], tokens)
        if estimate is not None and estimate * 1.3 < left:
            break
        tokens -= 8192
    longest = max(fits, key=lambda f: f["largest_tokens_extrapolated"] or 0)
    out = {"largest_tokens_extrapolated": longest["largest_tokens_extrapolated"],
           "largest_variant": longest["variant"], "confirmed_tokens": None,
           "confirmed_variant": best["variant"]}
    if tokens <= lengths[-1]:
        out["confirm_status"] = "no time for a length beyond the measured ones"
        return out
    try:
        begun = time.perf_counter()
        row = measure(layout, best["variant"], tokens, args, timed=False)
        row["wall_s"] = round(time.perf_counter() - begun, 1)  # one untimed step, cold
        out.update(confirmed_tokens=tokens, confirmed_row=row)
    except torch.OutOfMemoryError:
        out.update(confirm_status=f"oom at {tokens}")
    print(json.dumps(out), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (CPU smoke test)")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS))
    parser.add_argument("--logprob-chunk", type=int, default=4096)
    parser.add_argument("--mlp-chunk", type=int, default=8192)
    parser.add_argument("--every", type=int, default=4, help="blocks per checkpoint (groups)")
    parser.add_argument("--host-limit-gb", type=float, default=None,
                        help="the offload's host_cache_limit_gb (default: 80%% of the host's "
                             "memory, at most 100)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--lengths", type=int, nargs="*", default=None,
                        help="sequence lengths (default 8K 32K 64K 128K; --tiny: 128..512)")
    parser.add_argument("--timed-lengths", type=int, default=2,
                        help="the first this many lengths are timed (8K and 32K)")
    parser.add_argument("--usable", type=float, default=0.97,
                        help="share of the GPU's memory the extrapolation may fill")
    parser.add_argument("--budget-s", type=float, default=540.0)
    parser.add_argument("--interleave-rounds", type=int, default=0,
                        help="time the timed variants again, one step of each in turn, this "
                             "many rounds at each timed length (step_time_interleaved)")
    parser.add_argument("--no-confirm", dest="confirm", action="store_false",
                        help="skip the confirmed run at the longest length")
    parser.add_argument("--confirm-variant", default=None,
                        help="confirm this variant (default: the one extrapolating longest)")
    parser.add_argument("--confirm-tokens", type=int, default=0,
                        help="confirm at this length (default: the longest the time left allows)")
    args = parser.parse_args()
    if args.tiny:
        args.logprob_chunk, args.mlp_chunk = min(args.logprob_chunk, 128), min(args.mlp_chunk, 96)
    if args.host_limit_gb is None:
        args.host_limit_gb = min(100.0, 0.8 * host_memory_gib())
    result = run(args)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k not in ("rows", "shapes")}), flush=True)


if __name__ == "__main__":
    main()
