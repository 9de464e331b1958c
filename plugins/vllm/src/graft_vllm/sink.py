"""`VLLMSink`: push exported weights into a running vLLM engine.

Buckets are copied into a staging dict as they arrive; only at `finish` are they checked (every
name known to the engine, every shape right: a wrong one would leave the engine unusable) and
handed over in one call, then the prefix cache is reset (cached KV blocks were computed with the
old weights). An in-process engine takes the tensors directly (``reload_weights``); an engine in
its own process loads them from one safetensors file in ``/dev/shm``. A failure before `finish`
leaves the engine on its old weights.

Handlers export in an inference engine's loader layout (consumer `graft.export.INFERENCE_LAYOUT`):
a model whose experts are fused on disk may stream them one expert at a time
(``...experts.<id>.<param>``), which the engine takes in place of its fused tensor.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from graft.errors import GraftError
from graft.export import INFERENCE_LAYOUT, StagingSink
from graft_vllm.delta import DeltaEntry
from graft_vllm.fused_experts import expert_of_fused, split_fused


def check_engine_shapes(staged: dict[str, torch.Tensor],
                        expected: dict[str, tuple[int, ...]]) -> None:
    """A `GraftError` unless every staged tensor is one the engine has, with its shape: a name
    of ``expected`` (the engine's initial weights), or one expert of a fused tensor there."""
    for name, tensor in staged.items():
        shape = tuple(tensor.shape)
        want = expected.get(name)
        if want == shape or (want is None and expert_of_fused(name, shape, expected)):
            continue
        raise GraftError(f"export for vLLM: {name} {shape} does not match the engine's weights "
                         f"({want}); the engine keeps its old weights")


class VLLMSink(StagingSink):
    """Stages an export and loads it into ``llm`` at once."""

    consumer = INFERENCE_LAYOUT

    def __init__(self, llm: Any, expected_shapes: dict[str, tuple[int, ...]], *,
                 delta: bool = False, current: dict[str, torch.Tensor] | None = None) -> None:
        super().__init__()
        self.llm = llm
        self.expected = expected_shapes
        self._delta = delta
        # The last pushed weights, kept only for delta exports: vLLM reloads whole tensors, so
        # every push sends all of them, row updates applied to a copy. ``current`` (what the
        # engine started with; usually the `DeltaTracker`'s snapshot) is kept by reference and
        # updated in place, so it follows the layout the exporter now sends (fused experts
        # split per expert as the snapshot is). Full exports keep nothing between pushes.
        self.current: dict[str, torch.Tensor] = {}
        if delta and current is not None:
            self.current = current

    def consume_updates(self, updates: list[DeltaEntry]) -> None:
        """Apply a delta export's row updates (`graft_vllm.delta.DeltaTracker`) to a copy of
        the last pushed weights (vLLM reloads whole tensors)."""
        for entry in updates:
            if entry.rows is None:
                self.staged[entry.name] = entry.values.detach().to("cpu", copy=True)
                continue
            split_fused(self.current, entry.name)
            base = self.staged.get(entry.name)
            if base is None:
                base = self.current[entry.name].clone()
            base[entry.rows.cpu()] = entry.values.detach().cpu()
            self.staged[entry.name] = base

    def finish(self) -> None:
        """Check names and shapes, then reload the engine's weights and reset its prefix cache.

        A delta push sends every weight (the last pushed ones where nothing changed): vLLM
        re-processes a layer once all of its weights arrived, and a layer given only some of
        them would be rebuilt from uninitialised memory.
        """
        from graft_vllm.engine import worker_of

        self.check_complete()
        check_engine_shapes(self.staged, self.expected)
        if self._delta:  # the last weights, per expert where this export is
            for name in self.staged:
                split_fused(self.current, name)
        update = {**self.current, **self.staged} if self._delta else self.staged
        worker = worker_of(self.llm)
        if worker is not None:
            worker.reload_weights(weights_iterator=iter(update.items()))
        else:
            self._push_through_file(update)
        self.llm.reset_prefix_cache()
        if self._delta:
            self.current.update(self.staged)
        self.staged = {}

    def _push_through_file(self, update: dict[str, torch.Tensor]) -> None:
        from safetensors.torch import save_file

        shm = Path("/dev/shm")  # memory-backed where it exists: the file never touches a disk
        path = (shm if shm.is_dir() else Path(".")) / f"graft-weights-{os.getpid()}.safetensors"
        save_file({k: v.contiguous() for k, v in update.items()}, str(path))
        try:
            self.llm.collective_rpc("graft_load_safetensors", kwargs={"path": str(path)})
        finally:
            path.unlink(missing_ok=True)
