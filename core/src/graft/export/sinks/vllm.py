"""`VLLMSink`: push exported weights into a running (in-process) vLLM engine.

Buckets are copied into a staging dict as they arrive; only at `finish` are they checked (every
name known to the engine, every shape right: a wrong one would leave the engine unusable) and
handed to the worker's ``reload_weights`` in one call, then the prefix cache is reset (cached KV
blocks were computed with the old weights). A failure before `finish` leaves the engine on its
old weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from graft.errors import GraftError
from graft.export.sinks.base import DeltaEntry


def safetensors_shapes(model_dir: Path) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in a HF directory's safetensors files (headers only)."""
    from safetensors import safe_open

    shapes = {}
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(file), "pt") as handle:
            for name in handle.keys():
                shapes[name] = tuple(handle.get_slice(name).get_shape())
    return shapes


class VLLMSink:
    """Stages an export and loads it into ``llm`` at once."""

    def __init__(self, llm: Any, expected_shapes: dict[str, tuple[int, ...]]) -> None:
        self.llm = llm
        self.expected = expected_shapes
        self.current: dict[str, torch.Tensor] = {}
        self._staged: dict[str, torch.Tensor] = {}

    def begin(self) -> None:
        """Start staging."""
        self._staged = {}

    def consume(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        """Copy a bucket out of the reused buffer."""
        for name, tensor in tensors:
            self._staged[name] = tensor.detach().to("cpu", copy=True)

    def consume_delta(self, entries: list[DeltaEntry]) -> None:
        """Apply row updates to a copy of the last pushed weights (vLLM reloads whole tensors)."""
        for entry in entries:
            if entry.rows is None:
                self._staged[entry.name] = entry.values.detach().to("cpu", copy=True)
                continue
            base = self._staged.get(entry.name)
            if base is None:
                base = self.current[entry.name].clone()
            base[entry.rows.cpu()] = entry.values.detach().cpu()
            self._staged[entry.name] = base

    def finish(self) -> None:
        """Check names and shapes, then reload the engine's weights and reset its prefix cache."""
        from graft.inference.vllm_engine import worker_of

        for name, tensor in self._staged.items():
            want = self.expected.get(name)
            if want is None or tuple(tensor.shape) != want:
                raise GraftError(f"export for vLLM: {name} {tuple(tensor.shape)} does not match "
                                 f"the engine's weights ({want}); the engine keeps its old weights")
        update = {**self.current, **self._staged} if self.current else self._staged
        worker_of(self.llm).reload_weights(weights_iterator=iter(update.items()))
        self.llm.reset_prefix_cache()
        self.current, self._staged = update, {}

    def abort(self, error: BaseException) -> None:
        """Drop the staged update; nothing reached the engine."""
        self._staged = {}
