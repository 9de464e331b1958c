"""`graft.export.ExportFilter`, the exporter's per-entry seam (graft-vllm's delta export is one),
in process and without any plugin: an entry dropped, replaced, or sent to the sink on its own as
an update; a filter that keeps every entry exports what an exporter without one does; an update
for a sink without ``consume_updates`` is refused and the sink keeps its weights. Row blocks
through a filter, under expert parallelism: test_expert_rows.py."""

from __future__ import annotations

import pytest
import torch

from graft.export import ExportFilter, RowBlock, UpdateSink, WeightExporter
from graft.export.sinks.base import StateDictSink
from graft.training.trainer import Trainer

NORM, HEAD, EMBED = "model.norm.weight", "lm_head.weight", "model.embed_tokens.weight"


class Update:
    """What the test filters send outside the bucket: a named copy of a tensor."""

    def __init__(self, name: str, tensor: torch.Tensor) -> None:
        self.name, self.values = name, tensor.clone()

    @property
    def nbytes(self) -> int:
        return self.values.numel() * self.values.element_size()


class UpdatingSink(StateDictSink):
    """A state dict that also keeps the updates it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.updates: list[Update] = []

    def consume_updates(self, updates: list[Update]) -> None:
        self.updates.extend(updates)


class Edits:
    """Drops the final norm, zeroes the head, sends the embedding as an update; counts exports
    (every one after the first may be partial)."""

    def __init__(self) -> None:
        self.exports = 0

    def begin(self) -> bool:
        self.exports += 1
        return self.exports > 1

    def tensor(self, name: str, tensor: torch.Tensor) -> object:
        if name == NORM:
            return None
        if name == HEAD:
            return torch.zeros_like(tensor)
        return Update(name, tensor) if name == EMBED else tensor

    def rows(self, block: RowBlock) -> RowBlock:
        return block


class KeepAll(Edits):
    def tensor(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        return tensor


def exporter(trainer: Trainer, **kwargs) -> WeightExporter:
    return WeightExporter(trainer.engine.model, bucket_bytes=1 << 20, dtype=None, is_main=True,
                          **kwargs)


@pytest.fixture
def reference(trained_moe: Trainer) -> dict[str, torch.Tensor]:
    """A full export without a filter."""
    sink = StateDictSink()
    exporter(trained_moe).export(sink)
    return sink.weights


def test_an_export_filter_drops_replaces_and_sends_updates(trained_moe: Trainer,
                                                           reference: dict) -> None:
    edits = Edits()
    assert isinstance(edits, ExportFilter) and isinstance(UpdatingSink(), UpdateSink)
    filtered = exporter(trained_moe, entry_filter=edits)
    assert filtered.copy_plan is None  # a filter sees every entry: streamed
    sink = UpdatingSink()
    first = filtered.export(sink)
    assert not first.partial and edits.exports == 1
    assert set(sink.weights) == set(reference) - {NORM, EMBED}
    assert torch.equal(sink.weights[HEAD], torch.zeros_like(reference[HEAD]))
    assert all(torch.equal(sink.weights[k], reference[k]) for k in set(sink.weights) - {HEAD})
    (update,) = sink.updates
    assert update.name == EMBED and torch.equal(update.values, reference[EMBED])
    total = sum(t.numel() * t.element_size() for t in reference.values())
    norm_bytes = reference[NORM].numel() * reference[NORM].element_size()
    assert first.bytes_total == total and first.bytes_sent == total - norm_bytes
    assert first.tensors == len(reference)
    assert filtered.export(sink).partial and edits.exports == 2


def test_a_filter_that_keeps_every_entry_exports_what_none_does(trained_moe: Trainer,
                                                                reference: dict) -> None:
    sink = StateDictSink()
    stats = exporter(trained_moe, entry_filter=KeepAll()).export(sink)
    assert list(sink.weights) == list(reference)  # same names, same order
    assert all(torch.equal(sink.weights[k], reference[k]) for k in reference)
    assert stats.bytes_sent == stats.bytes_total


def test_an_update_needs_a_sink_that_takes_updates(trained_moe: Trainer, reference: dict) -> None:
    sink = StateDictSink()
    sink.weights = {k: v.clone() for k, v in reference.items()}
    with pytest.raises(TypeError, match="Edits sends updates only a sink with consume_updates "
                                        "applies; StateDictSink has none"):
        exporter(trained_moe, entry_filter=Edits()).export(sink)
    assert not sink.staged  # aborted: nothing half applied
    assert all(torch.equal(sink.weights[k], reference[k]) for k in reference)
