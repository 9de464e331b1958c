"""Per-rank random-number-generator state, saved as JSON (no pickles) and restored exactly."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture_rng_state() -> dict[str, Any]:
    """torch (CPU and CUDA), Python and numpy generator states as JSON-ready values."""
    state: dict[str, Any] = {
        "torch": torch.get_rng_state().tolist(),
        "python": _to_lists(random.getstate()),
        "numpy": _to_lists(np.random.get_state(legacy=True)),
    }
    if torch.cuda.is_available():
        state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Undo `capture_rng_state`."""
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])


def _to_lists(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (tuple, list)):
        return [_to_lists(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value
