"""A plugin's adapters loaded by vLLM itself (``graft_rollout_adapter``), without graft-lora.

usage: adapter_hook.py OUT_JSON RUN_DIR {serves|refused}

The test plugin's adapter puts a fixed LoRA on every ``q_proj`` of tiny-llama (``serves``) or
on a module vLLM's Llama lacks (``refused``); the trainer's model has no adapter, so the
rollout's log-probs move away from the trainer's exactly when vLLM generates with it. Writes
what the plugin saw (the first export inside ``base_only``, the writes) and the run's metrics,
or the run's error.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from graft import hookimpl
from graft.config import compose
from graft.engine.distributed.env import shutdown_distributed
from graft.errors import ConfigError
from graft.testing import registered_plugin
from graft.training.trainer import Trainer

RANK = 2


class FixedAdapter:
    """A `graft.rollout.RolloutAdapter` whose PEFT directory holds a fixed LoRA."""

    fallback = "the-test-plugin.sync=merged"
    required = True  # the user asked for adapter-only sync: a limit vLLM knows is an error

    def __init__(self, model: torch.nn.Module, module: str) -> None:
        self.module = module
        self.rank, self.targets = RANK, [module]
        self.shapes = {name: tuple(m.weight.shape) for name, m in model.named_modules()
                       if name.endswith(".self_attn.q_proj")}
        self.events: list[str] = []

    @contextmanager
    def base_only(self) -> Iterator[None]:
        self.events.append("base_only")
        yield
        self.events.append("base_only done")

    def write(self, out_dir: Path, *, is_main: bool) -> None:
        from safetensors.torch import save_file

        self.events.append("write")
        if not is_main:
            return
        generator = torch.Generator().manual_seed(0)
        tensors = {}
        for name, (rows, cols) in self.shapes.items():
            key = f"base_model.model.{name.removesuffix('q_proj')}{self.module}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(RANK, cols, generator=generator)
            tensors[f"{key}.lora_B.weight"] = torch.randn(rows, RANK, generator=generator)
        out_dir.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(out_dir / "adapter_model.safetensors"))
        config = {"peft_type": "LORA", "r": RANK, "lora_alpha": RANK,
                  "target_modules": [self.module], "bias": "none"}
        (out_dir / "adapter_config.json").write_text(json.dumps(config))


class Plugin:
    def __init__(self, module: str) -> None:
        self.module = module
        self.adapters: list[FixedAdapter] = []

    @hookimpl
    def graft_rollout_adapter(self, model: Any, cfg: Any) -> FixedAdapter:
        self.adapters.append(FixedAdapter(model, self.module))
        return self.adapters[-1]


def main(out: str, run_dir: str, mode: str) -> None:
    plugin = Plugin("q_proj" if mode == "serves" else "not_in_vllm")
    cfg = compose([f"trainer.run_dir={run_dir}", "trainer.total_steps=2", "model.preset=tiny-llama",
                   "engine.device=cpu", "rollout.engine=vllm", "rollout.prompts_per_step=2",
                   "rollout.n=2", "rollout.max_new_tokens=8", "checkpoint.every_steps=0",
                   "checkpoint.save_at_end=false", "export.hf_at_end=false"])
    result: dict[str, Any] = {}
    with registered_plugin(plugin, name="fixed-adapter"):
        try:
            Trainer(cfg).fit()
        except ConfigError as exc:
            result["error"] = str(exc)
    metrics = Path(run_dir) / "metrics.jsonl"
    result["rows"] = ([json.loads(line) for line in metrics.read_text().splitlines()]
                      if metrics.exists() else [])
    result["events"] = [adapter.events for adapter in plugin.adapters]
    adapter_file = Path(run_dir) / "rollout_adapter" / "adapter_model.safetensors"
    result["adapter_bytes"] = adapter_file.stat().st_size if adapter_file.exists() else 0
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:4])
    shutdown_distributed()
