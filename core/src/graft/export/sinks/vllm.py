"""`VLLMSink`: push exported weights into a running vLLM engine.

Buckets are copied into a staging dict as they arrive; only at `finish` are they checked (every
name known to the engine, every shape right: a wrong one would leave the engine unusable) and
handed over in one call, then the prefix cache is reset (cached KV blocks were computed with the
old weights). An in-process engine takes the tensors directly (``reload_weights``); an engine in
its own process loads them from one safetensors file in ``/dev/shm``. A failure before `finish`
leaves the engine on its old weights.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from graft.errors import GraftError
from graft.export.sinks.base import DeltaEntry, StagingSink


class VLLMSink(StagingSink):
    """Stages an export and loads it into ``llm`` at once."""

    def __init__(self, llm: Any, expected_shapes: dict[str, tuple[int, ...]], *,
                 delta: bool = False, current: dict[str, torch.Tensor] | None = None) -> None:
        super().__init__()
        self.llm = llm
        self.expected = expected_shapes
        self._delta = delta
        # The last pushed weights, kept only for delta exports (``current``: what the engine
        # started with): vLLM reloads whole tensors, so row updates are applied to a copy of
        # them. Full exports keep nothing between pushes.
        self.current: dict[str, torch.Tensor] = dict(current or {}) if delta else {}

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
        update = {**self.current, **self._staged} if self._delta else self._staged
        worker = worker_of(self.llm)
        if worker is not None:
            worker.reload_weights(weights_iterator=iter(update.items()))
        else:
            self._push_through_file(update)
        self.llm.reset_prefix_cache()
        if self._delta:
            self.current = update
        self._staged = {}

    def _push_through_file(self, update: dict[str, torch.Tensor]) -> None:
        from safetensors.torch import save_file

        shm = Path("/dev/shm")  # memory-backed where it exists: the file never touches a disk
        path = (shm if shm.is_dir() else Path(".")) / f"graft-weights-{os.getpid()}.safetensors"
        save_file({k: v.contiguous() for k, v in update.items()}, str(path))
        try:
            self.llm.collective_rpc("graft_load_safetensors", kwargs={"path": str(path)})
        finally:
            path.unlink(missing_ok=True)
