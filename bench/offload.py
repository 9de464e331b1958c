"""Activation offload on one GPU: an 8B-class dense model at 8K, 32K and 64K tokens, variants side by side.

Model: transformers ``LlamaForCausalLM`` with Llama-3-8B shapes (hidden 4096, MLP 14336, 32
layers, 32 heads / 8 KV heads of 128, vocab 128256), built on the meta device and materialised
on the GPU in bf16 with random weights; a plain module (one GPU, no FSDP). Activation
checkpointing on (transformers' non-reentrant). A step is the forward and backward of one
sequence, no optimizer step. The loss is the log-sum-exp of the last position's logits
(``logits_to_keep=1``: the full-sequence logits, 16 GiB at 64K, would hide the decoder's
activations) and weight gradients are dropped as they are accumulated (as FSDP2 frees them after
its reduce-scatter), so the peak is weights plus activations.

Variants: ``none``; ``offload`` (graft-offload's `apply_offload` on the 32 decoder blocks, the
plugin's defaults, timing events on); ``none+compile`` / ``offload+compile`` (every block
``torch.compile(dynamic=False)``, as ``engine.compile=true`` with ``pad_to_length``);
``save_on_cpu`` (``torch.autograd.graph.save_on_cpu(pin_memory=True)`` around the forward).

Reported per row: peak GPU memory during the measured steps, step time, tokens/s, D2H and H2D
GB/s achieved and the exposed copy time (compute-stream waits for copies) from CUDA events, the
median copy-out time of one block input against the median forward time of one block, the share
of the boundary set (the inputs of blocks 0..30) freed, the overhead against ``none`` of the same
compile mode. Then the largest sequence that fits with and without the plugin, extrapolated from
the measured peaks (memory is linear in tokens here). Rows run in priority order; a row whose
estimated time would pass ``--budget-s`` is skipped and listed as such. Compiled rows warm up
once per length and routing (routing switches a block's class, on which dynamo guards).

``--fit-cap-gib`` instead caps the GPU's memory and searches the largest length that fits with
and without the plugin, one forward + backward per length tried (doubling, then bisection).

    python bench/offload.py --out $OUT/offload.json     # one H200; --budget-s bounds the run
    python bench/offload.py --fit-cap-gib 32 --out $OUT/offload_fit.json   # ~90 s on one H200
    python bench/offload.py --small                     # CPU smoke test (stand-in copy backend)
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import traceback

import torch

SHAPES_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
             "vocab_size": 128256, "max_position_embeddings": 131072}
SHAPES_SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                "vocab_size": 256, "max_position_embeddings": 4096}
# Priority order (rows that do not fit --budget-s are skipped); 8K "none" is the calibration.
PLAN = [(65536, "none"), (65536, "offload"), (32768, "none"), (32768, "offload"),
        (8192, "offload"), (8192, "none+compile"), (8192, "offload+compile"),
        (32768, "save_on_cpu"), (8192, "save_on_cpu"), (65536, "save_on_cpu"),
        (32768, "none+compile"), (32768, "offload+compile"),
        (65536, "none+compile"), (65536, "offload+compile")]
SMALL_PLAN = [(1024, "none"), (1024, "offload"), (512, "offload"), (256, "none+compile"),
              (256, "offload+compile"), (512, "save_on_cpu")]
PINNED_GBPS = 1.4  # first pinned allocation, GB/s (4 GiB took 2.8 s on the H200 host)
# inductor, one Llama-8B block, forward + backward; "retrace": a length compiled before, blocks
# routed differently (dynamo retraces, inductor's cache has the kernels)
COMPILE_S = {"first": 45.0, "next": 30.0, "retrace": 5.0}
WORKING_ACTIVATIONS = 30  # a block's backward working set, in hidden-size vectors per token


def build_model(shapes: dict, device: torch.device) -> torch.nn.Module:
    """The model on the meta device, materialised on ``device`` in bf16 with random weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("llama", **shapes, tie_word_embeddings=False, use_cache=False)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.to_empty(device=device)
    generator = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.02, generator=generator)
    with torch.device(device):  # to_empty left the rotary buffers uninitialised: rebuild them
        model.model.rotary_emb = type(model.model.rotary_emb)(model.config)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for param in model.parameters():
        param.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))
    return model.train()


class Bench:
    """One model, switched between variants: offload routed or not (one offloader, so its
    pinned pool survives), blocks compiled or eager (compiled once per block, kept aside)."""

    def __init__(self, shapes: dict, device: torch.device, small: bool) -> None:
        from graft_offload.patching import unroute_calls
        from graft_offload.runtime import apply_offload

        self.device, self.small, self.shapes = device, small, shapes
        self.model = build_model(shapes, device)
        self.blocks = list(self.model.model.layers)
        backend = None
        if small:
            from graft_offload.standin import DeferredCopyBackend

            backend = DeferredCopyBackend()
        self.offloader = apply_offload([(f"model.layers.{i}", b) for i, b in enumerate(self.blocks)],
                                       device=device, backend=backend, timing=True,
                                       host_cache_limit_bytes=64 * 2**30,
                                       min_tensor_bytes=0 if small else 2**20)
        unroute_calls(self.blocks)
        self.routed = False
        self.compiled: list = []
        # (length, routed) pairs the compiled blocks ran at: routing switches the blocks' class,
        # and dynamo guards on it, so the routed blocks compile once more (a run routes before
        # its first forward and never pays this; the benchmark must not time it).
        self.compiled_lengths: set[tuple[int, bool]] = set()
        self.save_on_cpu_lengths: set[int] = set()  # lengths save_on_cpu's pinned cache holds
        self.pool_tokens = 0  # the longest sequence the offload's pinned pool was filled for

    def use(self, variant: str) -> None:
        """Route (or not) the blocks through the offloader and compile (or not) them."""
        from graft_offload.patching import route_calls, unroute_calls

        offload = variant.startswith("offload")
        if offload != self.routed:
            route_calls(self.blocks, self.offloader) if offload else unroute_calls(self.blocks)
            self.routed = offload
        compiled = variant.endswith("+compile")
        if compiled and not self.compiled:
            for block in self.blocks:
                block.compile(dynamic=False, **({"backend": "aot_eager"} if self.small else {}))
            self.compiled = [block._compiled_call_impl for block in self.blocks]
        for block, impl in zip(self.blocks, self.compiled, strict=False):
            # nn.Module.compile keeps the compiled callable here; None runs the block eagerly.
            block._compiled_call_impl = impl if compiled else None

    def fill_pool(self, tokens: int) -> None:
        """Allocate the offload's pinned buffers for ``tokens`` now, outside the timed steps
        (a run pays this once, in its first step)."""
        if tokens <= self.pool_tokens:
            return
        pool = self.offloader.pool
        nbytes = tokens * self.shapes["hidden_size"] * 2
        buffers = [pool.acquire(nbytes) for _ in range(len(self.blocks) - 1)]
        for buffer in buffers:
            if buffer is not None:
                pool.release(buffer)
        self.pool_tokens = tokens

    def reserve(self, tokens: int) -> None:
        """Grow the caching allocator to about the peak of ``none`` at ``tokens`` (one
        allocation, freed and kept cached), so timed steps do not pay cudaMalloc."""
        if self.device.type != "cuda":
            return
        hidden, layers = self.shapes["hidden_size"], self.shapes["num_hidden_layers"]
        extra = (layers + WORKING_ACTIVATIONS) * tokens * hidden * 2
        while extra > 2**30:
            try:
                block = torch.empty(extra, dtype=torch.uint8, device=self.device)
                del block
                return
            except torch.cuda.OutOfMemoryError:
                extra //= 2

    def step(self, ids: torch.Tensor, variant: str, *, backward: bool = True) -> dict[str, float]:
        """One forward (+ backward) of ``ids``; the offload's metrics when it is on."""
        if self.routed:
            self.offloader.begin_step()
        if variant == "save_on_cpu":
            with torch.autograd.graph.save_on_cpu(pin_memory=True):
                loss = self._loss(ids)
        else:
            loss = self._loss(ids)
        if backward:
            loss.backward()
        del loss
        if self.small and self.routed:
            self.offloader.backend.synchronize()
        return self.offloader.end_step() if self.routed else {}

    def _loss(self, ids: torch.Tensor) -> torch.Tensor:
        logits = self.model(input_ids=ids, logits_to_keep=1, use_cache=False).logits
        return logits.float().logsumexp(-1).sum()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def measure(bench: Bench, tokens: int, variant: str, *, warmup: str | None, steps: int) -> dict:
    """One row: ``warmup`` ("step", "forward" or None), then ``steps`` timed steps."""
    bench.use(variant)
    ids = torch.randint(0, bench.shapes["vocab_size"], (1, tokens), device=bench.device,
                        generator=torch.Generator(device=bench.device).manual_seed(tokens))
    if variant.startswith("offload"):
        bench.fill_pool(tokens)
    if warmup:
        bench.step(ids, variant, backward=warmup == "step")
    bench.reserve(tokens)
    bench.sync()
    cuda = bench.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(bench.device)
    before = torch.cuda.memory_allocated(bench.device) if cuda else 0
    metrics: list[dict[str, float]] = []
    started = time.perf_counter()
    for _ in range(steps):
        metrics.append(bench.step(ids, variant))
    bench.sync()
    seconds = (time.perf_counter() - started) / steps
    peak = torch.cuda.max_memory_allocated(bench.device) if cuda else 0
    row = {"tokens": tokens, "variant": variant, "status": "ok", "steps": steps,
           "warmup": warmup, "step_s": round(seconds, 4), "tokens_per_s": round(tokens / seconds),
           "peak_gib": round(peak / 2**30, 2), "activation_peak_gib": round((peak - before) / 2**30, 2)}
    for key in ("d2h_gbps", "h2d_gbps", "exposed_copy_ms", "d2h_ms_per_block",
                "forward_ms_per_block", "offloaded_gb", "host_gb"):
        values = [m[f"offload/{key}"] for m in metrics if f"offload/{key}" in m]
        if values:
            row[key] = round(sum(values) / len(values), 3)
    print(json.dumps(row), flush=True)
    return row


def estimate_s(tokens: int, step_s: dict[int, float]) -> float:
    """Step time at ``tokens`` from the nearest measured length (linear + quadratic in tokens)."""
    ref = min(step_s, key=lambda t: abs(t - tokens)) if step_s else 8192
    base, ratio = step_s.get(ref, 1.2), tokens / ref
    return base * (0.8 * ratio + 0.2 * ratio**2)


def warmup_for(bench: Bench, tokens: int, variant: str) -> tuple[str | None, float]:
    """What a row needs before timing, and its extra seconds beyond the steps: a full step to
    compile a length, a forward where save_on_cpu still has pinned memory to allocate, the
    pinned allocation of the plugin's pool (filled outside the timed steps)."""
    layers, hidden = bench.shapes["num_hidden_layers"], bench.shapes["hidden_size"]
    pinned_s = tokens * hidden * 2 * layers / (PINNED_GBPS * 1e9)
    compiled_key = (tokens, variant.startswith("offload"))
    if variant.endswith("+compile") and compiled_key not in bench.compiled_lengths:
        known = {t for t, _ in bench.compiled_lengths}
        return "step", COMPILE_S["retrace" if tokens in known else "next" if known else "first"]
    if variant == "save_on_cpu" and tokens not in bench.save_on_cpu_lengths:
        return "forward", pinned_s
    if variant.startswith("offload") and bench.pool_tokens < tokens:
        return None, pinned_s
    return None, 0.0


def max_tokens(rows: list[dict], variant: str, capacity_gib: float) -> dict | None:
    """The largest length that fits in ``capacity_gib``, from a least-squares line through the
    measured peaks of ``variant``."""
    points = [(r["tokens"], r["peak_gib"]) for r in rows if r["variant"] == variant and r["status"] == "ok"]
    if len({t for t, _ in points}) < 2:
        return None
    n = len(points)
    mean_t, mean_p = sum(t for t, _ in points) / n, sum(p for _, p in points) / n
    slope = sum((t - mean_t) * (p - mean_p) for t, p in points) / sum((t - mean_t) ** 2 for t, _ in points)
    fixed = mean_p - slope * mean_t
    return {"variant": variant, "gib_per_1k_tokens": round(slope * 1024, 4),
            "fixed_gib": round(fixed, 2), "max_tokens": int((capacity_gib - fixed) / slope) // 1024 * 1024,
            "from_lengths": sorted({t for t, _ in points})}


def fits(bench: Bench, tokens: int, variant: str) -> bool:
    """Whether one forward + backward of ``tokens`` runs without running out of GPU memory."""
    ids = torch.randint(0, bench.shapes["vocab_size"], (1, tokens), device=bench.device)
    bench.use(variant)
    try:
        bench.step(ids, variant)
        bench.sync()
        ok = True
    except torch.cuda.OutOfMemoryError:
        if bench.routed:
            bench.offloader.reset()
        ok = False
    del ids
    gc.collect()
    torch.cuda.empty_cache()
    print(json.dumps({"fit_trial": variant, "tokens": tokens, "fits": ok}), flush=True)
    return ok


def search_largest(bench: Bench, variant: str, *, start: int, resolution: int) -> dict:
    """The largest multiple of ``resolution`` tokens that fits: doubling from ``start`` until a
    length does not fit, then bisection; every length tried is recorded."""
    tried: dict[int, bool] = {}

    def attempt(tokens: int) -> bool:
        tried[tokens] = fits(bench, tokens, variant)
        return tried[tokens]

    good, bad = 0, start
    while attempt(bad):
        good, bad = bad, bad * 2
    while bad - good > resolution:
        middle = (good + bad) // 2 // resolution * resolution
        good, bad = (middle, bad) if attempt(middle) else (good, middle)
    return {"variant": variant, "max_tokens": good, "resolution": resolution,
            "tried": {str(t): ok for t, ok in sorted(tried.items())}}


def fit_search(bench: Bench, cap_gib: float, resolution: int) -> dict:
    """Cap the GPU at ``cap_gib`` and search the largest length that fits, with and without the
    plugin (a search on the whole GPU would take many minutes of quadratic attention)."""
    index = torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(cap_gib * 2**30 / total, index)
    searches = [search_largest(bench, v, start=16384, resolution=resolution)
                for v in ("none", "offload")]
    torch.cuda.set_per_process_memory_fraction(1.0, index)
    for search in searches:
        print(f"capped at {cap_gib} GiB, largest length that fits, {search['variant']}: "
              f"{search['max_tokens']} tokens (searched to {resolution})", flush=True)
    return {"cap_gib": cap_gib, "searches": searches}


def run_plan(bench: Bench, plan: list[tuple[int, str]], args: argparse.Namespace,
             started: float, step_s: dict[int, float]) -> list[dict]:
    """Measure the rows of ``plan`` in order, skipping those the budget cannot hold."""
    rows: list[dict] = []
    long_from = 512 if args.small else 16384
    for tokens, variant in plan:
        warmup, extra_s = warmup_for(bench, tokens, variant)
        steps = args.steps_short if tokens < long_from else args.steps_long
        estimate = extra_s + (steps + (warmup is not None)) * estimate_s(tokens, step_s)
        if time.perf_counter() - started + estimate > args.budget_s:
            rows.append({"tokens": tokens, "variant": variant, "status": "skipped (budget)",
                         "estimated_s": round(estimate, 1)})
            print(json.dumps(rows[-1]), flush=True)
            continue
        try:
            rows.append(measure(bench, tokens, variant, warmup=warmup, steps=steps))
        except torch.cuda.OutOfMemoryError:
            rows.append({"tokens": tokens, "variant": variant, "status": "out of memory"})
            torch.cuda.empty_cache()
            continue
        except Exception as exc:  # noqa: BLE001 - one failing row must not lose the others
            traceback.print_exc()
            rows.append({"tokens": tokens, "variant": variant,
                         "status": f"error: {type(exc).__name__}: {exc}"[:500]})
            continue
        if variant.endswith("+compile"):
            bench.compiled_lengths.add((tokens, variant.startswith("offload")))
        if variant == "save_on_cpu":
            bench.save_on_cpu_lengths.add(tokens)
        if variant == "none":
            step_s[tokens] = rows[-1]["step_s"]
    return rows


def compare(rows: list[dict], layers: int, hidden: int) -> None:
    """Add each row's overhead and freed share of the boundary set against ``none`` (same
    compile mode, same length)."""
    for row in rows:
        if row["status"] != "ok":
            continue
        peer = "none+compile" if row["variant"].endswith("+compile") else "none"
        base = next((r for r in rows if r["tokens"] == row["tokens"] and r["variant"] == peer
                     and r["status"] == "ok"), None)
        boundary = (layers - 1) * row["tokens"] * hidden * 2 / 2**30
        row["boundary_gib"] = round(boundary, 2)
        if base is not None and base is not row:
            row["overhead_pct"] = round(100 * (row["step_s"] / base["step_s"] - 1), 2)
            if boundary and base["peak_gib"]:
                row["freed_pct_of_boundary"] = round(
                    100 * (base["peak_gib"] - row["peak_gib"]) / boundary, 1)


def print_table(rows: list[dict], fits: list[dict]) -> None:
    columns = [("tokens", 6), ("variant", 16), ("step_s", 7), ("overhead_pct", 8),
               ("tokens_per_s", 8), ("peak_gib", 8), ("freed_pct_of_boundary", 7),
               ("d2h_gbps", 6), ("h2d_gbps", 6), ("exposed_copy_ms", 8), ("d2h_ms_per_block", 8),
               ("forward_ms_per_block", 8)]
    print(" ".join(f"{name[:width]:>{width}}" for name, width in columns))
    for row in rows:
        if row["status"] != "ok":
            print(f"{row['tokens']:>6} {row['variant']:>16} {row['status']}")
            continue
        print(" ".join(f"{str(row.get(name, '-'))[:width]:>{width}}" for name, width in columns))
    for fit in fits:
        print(f"largest length that fits, {fit['variant']}: {fit['max_tokens']} tokens "
              f"({fit['gib_per_1k_tokens']} GiB per 1K tokens + {fit['fixed_gib']} GiB)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny shapes on CPU (smoke test)")
    parser.add_argument("--budget-s", type=float, default=150.0,
                        help="skip rows whose estimated time would pass this many seconds")
    parser.add_argument("--steps-short", type=int, default=2, help="timed steps below 16K tokens")
    parser.add_argument("--steps-long", type=int, default=1, help="timed steps from 16K tokens")
    parser.add_argument("--only", default=None, help="comma-separated TOKENS:VARIANT rows to run")
    parser.add_argument("--fit-cap-gib", type=float, default=None,
                        help="instead of the plan: cap the GPU at this many GiB and search the "
                             "largest length that fits with and without the plugin")
    parser.add_argument("--fit-resolution", type=int, default=2048, help="tokens, for --fit-cap-gib")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    started = time.perf_counter()
    for key in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, key):  # a compiled graph per length and block class
            setattr(torch._dynamo.config, key, 64)
    device = torch.device("cpu" if args.small else "cuda")
    shapes = SHAPES_SMALL if args.small else SHAPES_8B
    plan = SMALL_PLAN if args.small else PLAN
    if args.only:
        plan = [(int(t), v) for t, v in (item.split(":") for item in args.only.split(","))]
    bench = Bench(shapes, device, args.small)
    if args.fit_cap_gib is not None:
        if device.type != "cuda":
            parser.error("--fit-cap-gib needs a GPU")
        result = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
                  "device": torch.cuda.get_device_name(), "shapes": shapes,
                  "fit": fit_search(bench, args.fit_cap_gib, args.fit_resolution),
                  "wall_s": round(time.perf_counter() - started, 1)}
        if args.out:
            with open(args.out, "w") as handle:
                json.dump(result, handle, indent=2)
        return
    # 8K (256 small) "none" first: it loads the kernels, and its step time starts the estimates.
    calibration = measure(bench, 256 if args.small else 8192, "none", warmup="step",
                          steps=args.steps_short)
    step_s = {calibration["tokens"]: calibration["step_s"]}
    rows = [calibration, *run_plan(bench, plan, args, started, step_s)]
    compare(rows, shapes["num_hidden_layers"], shapes["hidden_size"])
    capacity = 0.0
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        capacity = (free + torch.cuda.memory_reserved(device)) / 2**30 - 1.0  # 1 GiB margin
    fits = [f for f in (max_tokens(rows, v, capacity) for v in ("none", "offload", "save_on_cpu"))
            if f] if capacity else []
    print_table(rows, fits)
    result = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
              "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (stand-in)",
              "shapes": shapes, "plan": plan, "budget_s": args.budget_s, "rows": rows,
              "capacity_gib": round(capacity, 1), "largest_fitting": fits,
              "wall_s": round(time.perf_counter() - started, 1)}
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
