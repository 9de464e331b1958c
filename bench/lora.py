"""LoRA RL on one GPU (#39): Graft with graft-lora against TRL's ``GRPOTrainer`` with the same
PEFT config, model, batch and lengths, and what LoRA lets fit on the card.

Models are random-init Llama-architecture models of real shapes (`SHAPES`: Qwen3-8B, Qwen3-32B,
their 151,936-token vocabulary; Qwen3-30B-A3B as Qwen3-MoE), bf16. Each part runs in a process
of its own (its memory gone after it), under its own time limit, and writes what it measured:

- ``graft``: GRPO with adapters of rank ``--rank`` (alpha 2 x rank) on every linear layer of the
  decoder (q, k, v, o, gate, up, down), ``--prompts`` x ``--n`` samples of up to
  ``--max-new-tokens`` a step, every other setting at its default (`auto` on CUDA);
- ``trl``: TRL's ``GRPOTrainer`` on the same model, PEFT ``LoraConfig`` (same rank, alpha and
  modules), batch and lengths; TRL's settings in the result (`trl_settings`);
- ``full``: full fine-tuning of the same model (no adapters) through Graft: fits or not, with
  the estimate of its weights, gradients and AdamW state;
- ``largest``: ``--largest`` shapes (Qwen3-14B by default) with adapters, graft-offload and
  ``--long-tokens`` responses;
- ``moe``: ``--moe`` shapes (16 of Qwen3-30B-A3B's 48 layers by default) with adapters on the
  attention and on every expert.

``largest`` and ``moe`` run their warm-up steps and one measured step; the others ``--steps``.

``--graft-overrides`` adds settings to every Graft part (``features.lora.engine_sync=adapter``:
the decode copy shares the frozen base; ``model.dtype=bfloat16``: the base built in bf16).
``--memory-cap-gib`` caps what each part may allocate, so a larger card answers what fits a
smaller one (79.2: an H100's).

Rollout tokens/s are the generated tokens over the generation's seconds; update tokens/s every
token of the step over the rest of the step. The first ``--warmup`` steps of every part (1 by
default; compilation, the allocator's growth) are left out of its means.

    python3 bench/lora.py --out $OUT/results/lora.json                    # every part
    python3 bench/lora.py --parts graft trl --tiny --out /tmp/lora.json   # CPU smoke test
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import mean
from typing import Any

SHAPES = {
    "qwen3-8b": {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                 "vocab_size": 151936},
    "qwen3-32b": {"hidden_size": 5120, "intermediate_size": 25600, "num_hidden_layers": 64,
                  "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
                  "vocab_size": 151936},
    "qwen3-14b": {"hidden_size": 5120, "intermediate_size": 17408, "num_hidden_layers": 40,
                  "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
                  "vocab_size": 151936},
    "qwen3-30b-a3b": {"hidden_size": 2048, "moe_intermediate_size": 768, "num_experts": 128,
                      "num_experts_per_tok": 8, "num_hidden_layers": 48,
                      "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                      "vocab_size": 151936},
    # Qwen3-30B-A3B's layers, 16 of its 48 (its whole does not fit one H100 with a decode copy)
    "qwen3-30b-a3b-16-layers": {"hidden_size": 2048, "moe_intermediate_size": 768,
                                "num_experts": 128, "num_experts_per_tok": 8,
                                "num_hidden_layers": 16, "num_attention_heads": 32,
                                "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936},
    # 32 of its 48 layers (the whole model's bf16 base and rank-32 expert adapters with their
    # AdamW state, about 82 GB, do not fit one H100)
    "qwen3-30b-a3b-32-layers": {"hidden_size": 2048, "moe_intermediate_size": 768,
                                "num_experts": 128, "num_experts_per_tok": 8,
                                "num_hidden_layers": 32, "num_attention_heads": 32,
                                "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936},
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
             "vocab_size": 512},
}
LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPT = "Repeat the pattern: abcabcabc"
MEASURES = ("LoRA RL (rank 32, every linear layer) of Qwen3-8B shapes on one GPU, Graft against "
            "TRL 1.16's GRPOTrainer with PEFT: 8 prompts x 8 samples, 256 new tokens")
HEADLINE = ("Graft step {parts.graft.step_s:.2f} s (rollout {parts.graft.rollout_tokens_per_s:,} "
            "tok/s, update {parts.graft.update_tokens_per_s:,} tok/s, peak "
            "{parts.graft.peak_memory_gib:.1f} GiB), TRL {parts.trl.step_s:.2f} s (rollout "
            "{parts.trl.rollout_tokens_per_s:,}, update {parts.trl.update_tokens_per_s:,}, peak "
            "{parts.trl.peak_memory_gib:.1f} GiB): {graft_over_trl_step}x TRL's step")


def device_name() -> str:
    """The GPU's name, or ``cpu``."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def graft_config(args: argparse.Namespace, run_dir: str, *, shape: str, lora: bool,
                 max_new_tokens: int, prompts: int, n: int, steps: int,
                 extra: list[str]) -> Any:
    """A Graft RL run of ``shape`` (its dense shapes on the Llama preset, MoE on Qwen3-MoE)."""
    from graft.config import compose

    shapes = dict(SHAPES["tiny" if args.tiny else shape])
    preset = "tiny-qwen3-moe" if "num_experts" in shapes else "tiny-llama"
    if preset == "tiny-qwen3-moe":  # the experts' field is num_local_experts in some versions
        from transformers import Qwen3MoeConfig

        if "num_experts" not in Qwen3MoeConfig().to_dict():
            shapes["num_local_experts"] = shapes.pop("num_experts")
    adapters = (["features.lora.enabled=true", f"features.lora.rank={args.rank}",
                 f"features.lora.alpha={2 * args.rank}",
                 f"features.lora.target_modules=[{','.join(LINEAR)}]"] if lora else [])
    return compose([
        f"trainer.run_dir={run_dir}", f"trainer.total_steps={steps}",
        f"model.preset={preset}", f"engine.device={'cpu' if args.tiny else 'cuda'}",
        f"rollout.prompts_per_step={prompts}", f"rollout.n={n}",
        f"rollout.max_new_tokens={max_new_tokens}", "optim.lr=1e-6",
        "checkpoint.every_steps=0", "checkpoint.save_at_end=false", "export.hf_at_end=false",
        *adapters, *[f"+model.overrides.{k}={v}" for k, v in shapes.items()],
        *args.graft_overrides, *extra])


def graft_part(args: argparse.Namespace, *, shape: str, lora: bool = True,
               max_new_tokens: int | None = None, prompts: int | None = None,
               n: int | None = None, steps: int | None = None,
               extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """One Graft run: its steps' throughput and memory."""
    from graft.training.trainer import Trainer

    with tempfile.TemporaryDirectory() as run_dir:
        cfg = graft_config(args, run_dir, shape=shape, lora=lora,
                           max_new_tokens=max_new_tokens or args.max_new_tokens,
                           prompts=prompts or args.prompts, n=n or args.n,
                           steps=steps or args.steps, extra=list(extra))
        trainer = Trainer(cfg)
        model = trainer.engine.model
        total = sum(p.numel() for p in model.parameters())
        trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
        history = trainer.fit()
    steady = history[args.warmup:]
    update_s = mean(r["update_s"] for r in steady)
    return {"shape": shape, "lora": lora, "overrides": list(extra),
            "parameters": total, "trained_parameters": trained,
            "auto": [str(choice) for choice in trainer.auto_choices],
            "samples_per_step": cfg.rollout.prompts_per_step * cfg.rollout.n,
            "max_new_tokens": cfg.rollout.max_new_tokens,
            "tokens_per_step": round(mean(r["tokens"] for r in steady)),
            "response_length": mean(r["response_length"] for r in steady),
            "rollout_tokens_per_s": round(mean(r["rollout_tokens_per_s"] for r in steady)),
            "update_tokens_per_s": round(mean(r["tokens"] for r in steady) / update_s),
            "rollout_s": mean(r["rollout_s"] for r in steady), "update_s": update_s,
            "step_s": mean(r["step_time_s"] for r in steady),
            "step_s_per_step": [round(r["step_time_s"], 3) for r in history],
            "train_infer_logprob_diff": mean(r["train_infer_logprob_diff"] for r in steady),
            "peak_memory_gib": max(r["peak_memory_gib"] for r in history)}


def trl_settings(args: argparse.Namespace, output_dir: str) -> dict[str, Any]:
    """TRL's ``GRPOConfig`` for the comparison: one optimizer step per RL step of
    ``prompts x n`` samples (micro-batches of ``n``, accumulated), the same lengths, learning
    rate and sampling, no KL term (Graft's default), bf16 and gradient checkpointing as TRL's
    PEFT guide recommends; generation with transformers (``use_vllm`` needs vLLM, which this
    image does not have)."""
    return {"output_dir": output_dir, "per_device_train_batch_size": args.n,
            "gradient_accumulation_steps": args.prompts, "num_generations": args.n,
            "max_completion_length": args.max_new_tokens, "max_steps": args.steps,
            "learning_rate": 1e-6, "beta": 0.0, "temperature": 1.0, "top_p": 1.0,
            "bf16": not args.tiny, "gradient_checkpointing": True, "logging_steps": 1,
            "report_to": "none", "save_strategy": "no", "use_vllm": False,
            "use_cpu": args.tiny}


def trl_part(args: argparse.Namespace) -> dict[str, Any]:
    """TRL's GRPOTrainer with PEFT on the same model: per optimizer step, the seconds, the
    generation's seconds (its ``_generate`` timed) and tokens."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, LlamaConfig, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from graft.data.tokenizer import builtin_tokenizer

    shapes = SHAPES["tiny" if args.tiny else "qwen3-8b"]
    device = "cpu" if args.tiny else "cuda"
    config = LlamaConfig(**shapes, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                         tie_word_embeddings=False, max_position_embeddings=4096)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            config, dtype=torch.float32 if args.tiny else torch.bfloat16)
    tokenizer = builtin_tokenizer()
    steps: list[dict[str, float]] = []

    class StepTimes(TrainerCallback):
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            if device == "cuda":
                torch.cuda.synchronize()
            steps.append({"start": time.perf_counter(), "generate_s": 0.0, "tokens": 0,
                          "generated": 0})

        def on_step_end(self, *_: Any, **__: Any) -> None:
            if device == "cuda":
                torch.cuda.synchronize()
            steps[-1]["step_s"] = time.perf_counter() - steps[-1]["start"]

    with tempfile.TemporaryDirectory() as output_dir:
        settings = trl_settings(args, output_dir)
        dataset = Dataset.from_list([{"prompt": f"{PROMPT} {i}"} for i in range(256)])
        peft = LoraConfig(r=args.rank, lora_alpha=2 * args.rank, target_modules=LINEAR,
                          lora_dropout=0.0, task_type="CAUSAL_LM")
        trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [
            float(len(c) % 7) for c in completions], args=GRPOConfig(**settings),
            train_dataset=dataset, processing_class=tokenizer, peft_config=peft,
            callbacks=[StepTimes()])
        generate = trainer._generate

        def timed_generate(prompts: Any, *rest: Any, **kwargs: Any) -> Any:
            if device == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            result = generate(prompts, *rest, **kwargs)
            if device == "cuda":
                torch.cuda.synchronize()
            steps[-1]["generate_s"] += time.perf_counter() - started
            completions = result[1] if isinstance(result, tuple) else result
            steps[-1]["generated"] += sum(len(ids) for ids in completions)
            return result

        trainer._generate = timed_generate
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        trainer.train()
        peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else 0.0
    steady = steps[args.warmup:]
    prompt_tokens = len(tokenizer(f"{PROMPT} 0")["input_ids"])
    tokens = [s["generated"] + prompt_tokens * args.prompts * args.n for s in steady]
    return {"shape": "qwen3-8b", "settings": {k: v for k, v in settings.items()
                                              if k != "output_dir"},
            "peft": {"r": args.rank, "lora_alpha": 2 * args.rank, "target_modules": LINEAR},
            "samples_per_step": args.prompts * args.n, "max_new_tokens": args.max_new_tokens,
            "response_length": mean(s["generated"] for s in steady) / (args.prompts * args.n),
            "rollout_tokens_per_s": round(mean(s["generated"] / s["generate_s"] for s in steady)),
            "update_tokens_per_s": round(mean(t / (s["step_s"] - s["generate_s"])
                                              for t, s in zip(tokens, steady, strict=True))),
            "rollout_s": mean(s["generate_s"] for s in steady),
            "update_s": mean(s["step_s"] - s["generate_s"] for s in steady),
            "step_s": mean(s["step_s"] for s in steady),
            "step_s_per_step": [round(s["step_s"], 3) for s in steps],
            "peak_memory_gib": round(peak, 2)}


def full_part(args: argparse.Namespace) -> dict[str, Any]:
    """Full fine-tuning of the same model through Graft: its step, or the out-of-memory error,
    with the estimate of bf16 weights + fp32 masters, gradients and AdamW state (16 bytes a
    parameter) before any activation."""
    import torch

    params = sum(_dense_parameters(SHAPES["tiny" if args.tiny else "qwen3-8b"]).values())
    estimate = {"parameters": params, "weights_grads_adamw_gib": round(16 * params / 2**30, 1),
                "gpu_gib": (round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
                            if torch.cuda.is_available() else None)}
    try:
        return {**estimate, "fits": True, **graft_part(args, shape="qwen3-8b", lora=False)}
    except torch.OutOfMemoryError as error:
        return {**estimate, "fits": False, "error": f"OutOfMemoryError: {error}"[:300],
                "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1)}


def _dense_parameters(shapes: dict[str, int]) -> dict[str, int]:
    """Parameter count of a dense Llama-shaped model by part."""
    hidden, layers, vocab = shapes["hidden_size"], shapes["num_hidden_layers"], shapes["vocab_size"]
    heads, kv, head = (shapes["num_attention_heads"], shapes["num_key_value_heads"],
                       shapes["head_dim"])
    attention = hidden * head * (2 * heads + 2 * kv)
    mlp = 3 * hidden * shapes["intermediate_size"]
    return {"embeddings_and_head": 2 * vocab * hidden, "layers": layers * (attention + mlp)}


def cap_memory(gib: float | None) -> None:
    """Let this process's tensors take at most ``gib`` GiB of the GPU (None: all of it), so
    that a larger card answers whether a part fits a smaller one."""
    import torch

    if gib is not None and torch.cuda.is_available():
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, gib * 2**30 / total))


def run_part(name: str, args: argparse.Namespace, limit_s: float) -> dict[str, Any]:
    """A part in a fresh process (its GPU memory gone after it), within ``limit_s`` seconds."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [sys.executable, __file__, "--part", name, "--part-out", out.name,
                   *sys.argv[1:]]
        started = time.perf_counter()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=limit_s)
        except subprocess.TimeoutExpired as expired:
            return {"error": f"over its {limit_s:.0f} s limit",
                    "log_tail": (expired.stderr or b"")[-1500:].decode(errors="replace")}
        seconds = round(time.perf_counter() - started, 1)
        print(f"part {name}: exit {done.returncode} in {seconds} s", flush=True)
        if done.returncode != 0 or not Path(out.name).stat().st_size:
            return {"error": f"exit {done.returncode}", "process_s": seconds,
                    "log_tail": done.stderr[-2500:]}
        return {**json.loads(Path(out.name).read_text()), "process_s": seconds}


PARTS = {
    "graft": lambda args: graft_part(args, shape="qwen3-8b"),
    "trl": trl_part,
    "full": full_part,
    "largest": lambda args: graft_part(
        args, shape=args.largest, max_new_tokens=args.long_tokens, prompts=args.long_prompts,
        n=4, steps=args.warmup + 1,
        extra=("features.offload.enabled=true", "engine.activation_checkpointing=true",
               f"engine.max_tokens_per_micro_batch={2 * args.long_tokens}")),
    "moe": lambda args: graft_part(args, shape=args.moe, prompts=4, n=8,
                                   steps=args.warmup + 1),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(PARTS))
    parser.add_argument("--limits", nargs="+", type=float, default=[200, 240, 90, 240, 200],
                        help="seconds each part may take, in --parts order")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--long-tokens", type=int, default=4096)
    parser.add_argument("--long-prompts", type=int, default=2,
                        help="prompts a step of the largest part (4 samples each)")
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--largest", choices=list(SHAPES), default="qwen3-14b")
    parser.add_argument("--moe", choices=list(SHAPES), default="qwen3-30b-a3b-16-layers")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1,
                        help="first steps of every part left out of its means")
    parser.add_argument("--graft-overrides", nargs="*", default=[],
                        help="settings every Graft part adds (features.lora.engine_sync=adapter)")
    parser.add_argument("--memory-cap-gib", type=float, default=None,
                        help="what the parts may allocate (an H100's 79.2 on a larger card)")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes on CPU (smoke test)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--part", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--part-out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not 0 <= args.warmup < args.steps:
        parser.error(f"--warmup {args.warmup} must leave a step of --steps {args.steps} to measure")
    if args.part:  # a part's own process
        cap_memory(args.memory_cap_gib)
        Path(args.part_out).write_text(json.dumps(PARTS[args.part](args)))
        return
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
                              "measures": (MEASURES if {"graft", "trl"} <= set(args.parts) else
                                           f"bench/lora.py's parts {', '.join(args.parts)}: "
                                           f"each part's shape and settings in its row"),
                              "device": device_name(),
                              "memory_cap_gib": args.memory_cap_gib, "parts": {}}
    for name, limit in zip(args.parts, args.limits, strict=False):
        result["parts"][name] = run_part(name, args, limit)
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1))
    parts = result["parts"]
    if "step_s" in parts.get("graft", {}) and "step_s" in parts.get("trl", {}):
        result["graft_over_trl_step"] = round(parts["trl"]["step_s"] / parts["graft"]["step_s"], 2)
        result["headline"] = HEADLINE
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({name: {k: v for k, v in part.items() if k != "log_tail"}
                      for name, part in parts.items()}, indent=1))


if __name__ == "__main__":
    main()
