"""What Ulysses can serve: the model's heads and family, and its attention implementation."""

from __future__ import annotations

from typing import Any

from graft.errors import ConfigError
from graft_ulysses.attention import PREFIX, SERVED

# Families whose attention is transformers' standard one (Q, K, V through the attention-function
# registry, nothing per head outside it), checked by this plugin's tests or by their layout.
# A plugin's family opts in with ``extras={"ulysses": True}``.
STANDARD_FAMILIES = frozenset({"llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3"})


def check_heads(config: Any, sp: int) -> None:
    """`ConfigError` unless ``sp`` divides the attention heads, and divides the KV heads or is
    a multiple of them (then each KV head is repeated on ``sp / kv`` ranks)."""
    heads = int(config.num_attention_heads)
    kv = int(getattr(config, "num_key_value_heads", None) or heads)
    if heads % sp:
        raise ConfigError(f"features.ulysses.sp_size={sp} must divide the model's "
                          f"{heads} attention heads (each rank attends with heads / sp_size of "
                          f"them); choose an sp_size among {divisors(heads)}")
    if kv % sp and sp % kv:
        raise ConfigError(f"features.ulysses.sp_size={sp} and the model's {kv} KV heads: "
                          f"sp_size must divide them or be a multiple of them (KV heads are then "
                          f"repeated); choose an sp_size among "
                          f"{[d for d in divisors(heads) if kv % d == 0 or d % kv == 0]}")


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` above 1."""
    return [d for d in range(2, n + 1) if n % d == 0]


def check_family(family: Any, sp: int) -> None:
    """`ConfigError` for a family whose attention Ulysses cannot wrap."""
    if family.model_type in STANDARD_FAMILIES or family.extras.get("ulysses"):
        return
    raise ConfigError(f"features.ulysses.sp_size={sp}: the model family {family.model_type!r} is "
                      f"not served by graft-ulysses (its attention keeps per-head state outside "
                      f"transformers' attention function, or is not checked yet). Served: "
                      f"{', '.join(sorted(STANDARD_FAMILIES))}; a family opts in with "
                      f"extras={{'ulysses': True}}. Set features.ulysses.sp_size=1")


def check_attention(config: Any, sp: int) -> None:
    """`ConfigError` for an attention implementation whose whole-row mask is not built here."""
    current = (config._attn_implementation or "eager").removeprefix(PREFIX)
    if current not in SERVED:
        raise ConfigError(f"features.ulysses.sp_size={sp} with model.attn_implementation="
                          f"{current!r}: graft-ulysses wraps {', '.join(SERVED)}; set "
                          f"model.attn_implementation to one of them")


def check_full_attention(config: Any, sp: int) -> None:
    """`ConfigError` for sliding-window layers: the whole-row mask built here is causal and
    packed, without a window."""
    types = getattr(config, "layer_types", None) or ()
    window = getattr(config, "sliding_window", None)
    if "sliding_attention" in types or (config.model_type == "mistral" and window):
        raise ConfigError(f"features.ulysses.sp_size={sp}: the model has sliding-window "
                          f"attention layers, which graft-ulysses does not serve yet; set "
                          f"features.ulysses.sp_size=1")
