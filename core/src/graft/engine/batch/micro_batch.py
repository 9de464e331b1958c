"""Packed micro-batches: layout, label roll, ``pad_to_length`` padding, and the one unpad function.

A micro-batch is ``R`` rows of ``L`` tokens. Families that pack sequences put all samples in one
row (``R = 1``), back to back, positions restarting at 0 for each; others give each sample its own
row. Every row ends with pad tokens up to ``L``; the pad forms its own segment (positions restart
at 0), has loss mask 0, temperature 1 and label ``pad_token_id``. With ``pad_to_length`` the rows
are padded further, to a multiple of the bucket, so compiled kernels see few distinct shapes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenSample:
    """One training sample: prompt then response token ids; the loss covers the response, or
    with ``response_mask`` (one weight per response token) the response tokens it marks
    (a multi-turn episode's model tokens)."""

    input_ids: Sequence[int]
    response_start: int
    response_mask: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass(frozen=True)
class Segment:
    """Where sample ``sample`` (its index in the micro-batch) sits: ``row``, ``start``, ``length``."""

    sample: int
    row: int
    start: int
    length: int


def pad_amount(length: int, bucket: int) -> int:
    """Tokens to append so ``length`` becomes a multiple of ``bucket`` (0 when it already is)."""
    return -length % bucket


@dataclass(frozen=True)
class PackedLayout:
    """The placement of a micro-batch's samples in its ``(num_rows, row_length)`` token grid."""

    segments: tuple[Segment, ...]
    num_rows: int
    row_length: int
    pad_size: int

    @property
    def num_samples(self) -> int:
        """Samples in this micro-batch."""
        return len(self.segments)

    @property
    def max_sample_length(self) -> int:
        """Length of the longest sample (0 for an empty micro-batch)."""
        return max((s.length for s in self.segments), default=0)

    def sequence_index(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat token index ``(S, max_len)`` into the ``R * L`` grid, and its validity mask."""
        steps = torch.arange(max(self.max_sample_length, 1))
        starts = torch.tensor([s.row * self.row_length + s.start for s in self.segments],
                              dtype=torch.long)
        lengths = torch.tensor([s.length for s in self.segments], dtype=torch.long)
        valid = steps[None, :] < lengths[:, None]
        index = torch.where(valid, starts[:, None] + steps[None, :], 0)
        return index, valid

    def unpad(self, per_token: torch.Tensor) -> list[torch.Tensor]:
        """Strip every pad token from a ``(R, L, ...)`` output: one tensor per sample, in order.

        The single function all per-token outputs (log-probs, entropy, values, router records)
        go through, whatever the row layout and ``pad_to_length`` padding.
        """
        return [per_token[s.row, s.start:s.start + s.length] for s in self.segments]

    def pack(self, per_sample: Sequence[torch.Tensor], fill: float | int = 0) -> torch.Tensor:
        """Place per-sample tensors ``(length, ...)`` in the ``(R, L, ...)`` grid; pad with ``fill``."""
        trailing = per_sample[0].shape[1:] if per_sample else ()
        dtype = per_sample[0].dtype if per_sample else torch.float32
        grid = torch.full((self.num_rows, self.row_length, *trailing), fill, dtype=dtype)
        for segment, values in zip(self.segments, per_sample, strict=True):
            grid[segment.row, segment.start:segment.start + segment.length] = values
        return grid


def gather_sequences(per_token: torch.Tensor, index: torch.Tensor,
                     valid: torch.Tensor) -> torch.Tensor:
    """``per_token`` ``(R, L, ...)`` gathered at ``index`` ``(S, T)``; zero where not ``valid``."""
    flat = per_token.reshape(-1, *per_token.shape[2:])
    gathered = flat[index]
    mask = valid.reshape(*valid.shape, *([1] * (gathered.dim() - 2)))
    return torch.where(mask, gathered, torch.zeros((), dtype=gathered.dtype,
                                                   device=gathered.device))


@dataclass
class MicroBatch:
    """Per-token tensors of shape ``(R, L, ...)`` by name, and their layout.

    Core names: ``input_ids``, ``labels``, ``loss_mask``, ``temperature``, ``position_ids``;
    RL adds ``old_logprobs``, ``advantages``...; plugins may add their own in
    ``graft_prepare_inputs``.
    """

    tensors: dict[str, torch.Tensor]
    layout: PackedLayout
    sequence_index: torch.Tensor
    sequence_valid: torch.Tensor

    def to(self, device: torch.device) -> MicroBatch:
        """Move every tensor to ``device``; to CUDA through pinned memory, without a sync."""

        def move(tensor: torch.Tensor) -> torch.Tensor:
            if tensor.device == device:
                return tensor
            if device.type == "cuda" and tensor.device.type == "cpu":
                return tensor.pin_memory().to(device, non_blocking=True)
            return tensor.to(device)

        return MicroBatch({k: move(v) for k, v in self.tensors.items()}, self.layout,
                          move(self.sequence_index), move(self.sequence_valid))

    def keep(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Store per-token ``(R, L, ...)`` tensors with this micro-batch (as they are, on their
        device) so later passes over it get them in ``tensors``."""
        for name, tensor in tensors.items():
            if tuple(tensor.shape[:2]) != (self.layout.num_rows, self.layout.row_length):
                raise ValueError(f"kept tensor {name!r} has shape {tuple(tensor.shape)}; per-token "
                                 f"tensors of this micro-batch start with "
                                 f"{(self.layout.num_rows, self.layout.row_length)}")
            self.tensors[name] = tensor

    def to_sequences(self, per_token: torch.Tensor) -> torch.Tensor:
        """Gather a per-token ``(R, L, ...)`` tensor of this batch into ``(S, max_len, ...)``."""
        return gather_sequences(per_token, self.sequence_index, self.sequence_valid)


def layout_rows(lengths: Sequence[int], *, packs_sequences: bool, pad_bucket: int | None,
                max_row_tokens: int | None = None) -> PackedLayout:
    """Place samples of ``lengths`` in rows and size the pad.

    Packing families put all samples in one row, or, with ``max_row_tokens``, in as few rows of
    at most that many tokens as first-fit-decreasing finds (a longer sample gets a row of its
    own): attention over a packed row costs the square of its length, so shorter rows cost
    less attention for a little more pad. Other families give each sample its own row.
    """
    if packs_sequences:
        rows = _fill_rows(lengths, max_row_tokens)
        segments, filled = [], []
        for row, members in enumerate(rows):
            offset = 0
            for index in members:
                segments.append(Segment(index, row, offset, lengths[index]))
                offset += lengths[index]
            filled.append(offset)
        segments.sort(key=lambda s: s.sample)
        content, num_rows = max(filled, default=0), max(len(rows), 1)
    else:
        segments = [Segment(i, i, 0, length) for i, length in enumerate(lengths)]
        content, num_rows = max(lengths, default=0), max(len(lengths), 1)
    row_length = max(content, 1)
    if pad_bucket:
        row_length += pad_amount(row_length, pad_bucket)
    return PackedLayout(tuple(segments), num_rows, row_length, row_length - content)


def _fill_rows(lengths: Sequence[int], max_row_tokens: int | None) -> list[list[int]]:
    """Sample indices per row: one row of all when unlimited, else first-fit decreasing (each
    row keeps its samples in their original order)."""
    if not max_row_tokens or sum(lengths) <= max_row_tokens:
        return [list(range(len(lengths)))]
    rows: list[list[int]] = []
    room: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        row = next((r for r, free in enumerate(room) if free >= lengths[index]), None)
        if row is None:
            rows.append([])
            room.append(max(max_row_tokens, lengths[index]))
            row = len(rows) - 1
        rows[row].append(index)
        room[row] -= lengths[index]
    return [sorted(members) for members in rows]


def build_micro_batch(samples: Sequence[TokenSample], *, packs_sequences: bool,
                      pad_token_id: int, pad_bucket: int | None = None,
                      temperatures: Sequence[float] | None = None,
                      extras: Mapping[str, Sequence[torch.Tensor]] | None = None,
                      max_row_tokens: int | None = None) -> MicroBatch:
    """Pack ``samples``, roll labels within each sample, then pad rows (``pad_to_length``).

    ``extras`` are per-sample, per-token tensors aligned with the labels (entry ``t`` belongs to
    the prediction of token ``t + 1``), placed in the same grid with fill 0.
    """
    layout = layout_rows([len(s) for s in samples], packs_sequences=packs_sequences,
                         pad_bucket=pad_bucket, max_row_tokens=max_row_tokens)
    ids = [torch.as_tensor(list(s.input_ids), dtype=torch.long) for s in samples]
    labels = [torch.cat([i[1:], i.new_full((1,), pad_token_id)]) for i in ids]
    masks = [label_mask(s) for s in samples]
    temps = [torch.full((len(s),), float(t)) for s, t in
             zip(samples, temperatures or [1.0] * len(samples), strict=True)]
    tensors = {
        "input_ids": layout.pack(ids, fill=pad_token_id),
        "labels": layout.pack(labels, fill=pad_token_id),
        "loss_mask": layout.pack(masks, fill=0.0),
        "temperature": layout.pack(temps, fill=1.0),
        "position_ids": position_ids(layout),
    }
    for name, values in (extras or {}).items():
        tensors[name] = layout.pack(values, fill=0)
    return MicroBatch(tensors, layout, *layout.sequence_index())


def label_mask(sample: TokenSample) -> torch.Tensor:
    """1.0 where the label (the next token) is a response token of the same sample (and one
    ``response_mask`` marks, when the sample has one)."""
    steps = torch.arange(len(sample))
    mask = ((steps + 1 >= sample.response_start) & (steps + 1 < len(sample))).float()
    if sample.response_mask is not None:
        start = sample.response_start - 1  # position t predicts token t + 1
        mask[start:start + len(sample.response_mask)] *= sample.response_mask.float()
    return mask


def position_ids(layout: PackedLayout) -> torch.Tensor:
    """Positions restarting at 0 for every sample and for each row's trailing pad."""
    positions = torch.zeros(layout.num_rows, layout.row_length, dtype=torch.long)
    filled = [0] * layout.num_rows
    for segment in layout.segments:
        positions[segment.row, segment.start:segment.start + segment.length] = torch.arange(segment.length)
        filled[segment.row] = max(filled[segment.row], segment.start + segment.length)
    for row, end in enumerate(filled):
        positions[row, end:] = torch.arange(layout.row_length - end)
    return positions
