"""The core's rollout engines, registered as a built-in plugin (``graft_rollout_engines``).

Kept free of torch imports at module level: the plugin manager loads it for every command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from graft.hookspecs import hookimpl


def build_embedded(*, cfg: Any, engine: Any, env: Any, tokenizer: Any) -> Any:
    """The trained model itself generates (batched HF generation with a KV cache)."""
    from graft.rollout.embedded import EmbeddedRollout

    static = cfg.rollout.decode == "static"
    return EmbeddedRollout(engine.model, pad_token_id=tokenizer.pad_token_id,
                           eos_token_id=tokenizer.eos_token_id, device=env.device,
                           reshard_blocks=cfg.engine.reshard_after_forward,
                           static_copy_dtype=engine.compute_dtype if static else None,
                           compile_backend=cfg.rollout.decode_compile,
                           fuse_decode_kernels=cfg.rollout.decode_fuse_kernels,
                           left_padding_exact=engine.family.left_padding_exact, cfg=cfg,
                           exact=cfg.rollout.exact)


def build_vllm(*, cfg: Any, engine: Any, env: Any, run_dir: Path, tokenizer: Any) -> Any:
    """A vLLM engine on rank 0 whose weights are streamed from the trainer after every step."""
    from graft.rollout.vllm import VLLMRollout

    return VLLMRollout(engine.model, compute_dtype=engine.compute_dtype, cfg=cfg, env=env,
                       run_dir=run_dir, tokenizer=tokenizer)


@hookimpl
def graft_rollout_engines() -> dict[str, Any]:
    """``embedded`` and ``vllm``."""
    return {"embedded": build_embedded, "vllm": build_vllm}
