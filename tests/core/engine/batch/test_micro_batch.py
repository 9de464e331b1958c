"""Packed micro-batches: label roll, pad_to_length (verl's reference cases), one unpad function."""

from __future__ import annotations

import pytest
import torch

from graft.engine.batch.micro_batch import (
    TokenSample,
    build_micro_batch,
    layout_rows,
    pad_amount,
)

PAD = 0


@pytest.mark.parametrize(("length", "bucket", "pad"), [(700, 1024, 324), (12000, 1024, 288),
                                                        (1024, 1024, 0), (2048, 1024, 0),
                                                        (1, 1024, 1023)])
def test_pad_amount_reaches_the_next_bucket_multiple(length: int, bucket: int, pad: int) -> None:
    assert pad_amount(length, bucket) == pad
    assert (length + pad) % bucket == 0


def test_reference_cases_through_the_packed_layout() -> None:
    # 700 tokens -> pad 324; 12000 -> 12288 total (verl #7272's cases)
    assert layout_rows([300, 400], packs_sequences=True, pad_bucket=1024).pad_size == 324
    big = layout_rows([5000, 7000], packs_sequences=True, pad_bucket=1024)
    assert (big.row_length, big.pad_size) == (12288, 288)


def samples() -> list[TokenSample]:
    return [TokenSample([1, 10, 11, 12, 2], response_start=3),
            TokenSample([1, 20, 21, 2], response_start=2)]


def test_labels_roll_within_each_sample_and_mask_covers_responses() -> None:
    batch = build_micro_batch(samples(), packs_sequences=True, pad_token_id=PAD)
    t = batch.tensors
    assert t["input_ids"].tolist() == [[1, 10, 11, 12, 2, 1, 20, 21, 2]]
    # the last token of a sample never predicts the first token of the next sample
    assert t["labels"].tolist() == [[10, 11, 12, 2, PAD, 20, 21, 2, PAD]]
    # positions whose label is a response token: 12, 2 of sample 0; 21, 2 of sample 1
    assert t["loss_mask"].tolist() == [[0, 0, 1, 1, 0, 0, 1, 1, 0]]
    assert t["position_ids"].tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3]]
    assert batch.layout.pad_size == 0


def test_pad_to_length_adds_its_own_segment() -> None:
    batch = build_micro_batch(samples(), packs_sequences=True, pad_token_id=PAD, pad_bucket=8,
                              temperatures=[0.5, 0.7])
    t, layout = batch.tensors, batch.layout
    assert t["input_ids"].shape == (1, 16) and layout.pad_size == 7
    assert t["input_ids"][0, 9:].tolist() == [PAD] * 7
    assert t["position_ids"][0, 9:].tolist() == list(range(7))  # positions restart at 0
    assert t["loss_mask"][0, 9:].sum() == 0
    assert t["temperature"][0, 9:].tolist() == [1.0] * 7
    assert t["temperature"][0, :5].tolist() == [0.5] * 5


def test_pad_zero_is_a_no_op() -> None:
    plain = build_micro_batch(samples(), packs_sequences=True, pad_token_id=PAD)
    padded = build_micro_batch(samples(), packs_sequences=True, pad_token_id=PAD, pad_bucket=9)
    assert padded.layout.pad_size == 0
    for name, tensor in plain.tensors.items():
        assert torch.equal(tensor, padded.tensors[name]), name


def test_unpad_returns_each_sample_whatever_the_layout() -> None:
    for packs in (True, False):
        batch = build_micro_batch(samples(), packs_sequences=packs, pad_token_id=PAD, pad_bucket=4,
                                  extras={"score": [torch.arange(5.0), torch.arange(4.0) + 10]})
        per_sample = batch.layout.unpad(batch.tensors["input_ids"])
        assert [x.tolist() for x in per_sample] == [list(s.input_ids) for s in samples()]
        scores = batch.layout.unpad(batch.tensors["score"])
        assert scores[1].tolist() == [10.0, 11.0, 12.0, 13.0]
        # trailing dims survive (router records are (tokens, layers, top_k))
        records = torch.arange(batch.layout.num_rows * batch.layout.row_length * 6).reshape(
            batch.layout.num_rows, batch.layout.row_length, 3, 2)
        assert batch.layout.unpad(records)[0].shape == (5, 3, 2)


def test_rows_layout_gives_each_sample_a_row() -> None:
    batch = build_micro_batch(samples(), packs_sequences=False, pad_token_id=PAD)
    assert batch.tensors["input_ids"].tolist() == [[1, 10, 11, 12, 2], [1, 20, 21, 2, PAD]]
    assert batch.tensors["position_ids"][1].tolist() == [0, 1, 2, 3, 0]


def test_to_sequences_gathers_a_sequence_matrix() -> None:
    batch = build_micro_batch(samples(), packs_sequences=True, pad_token_id=PAD, pad_bucket=16)
    matrix = batch.to_sequences(batch.tensors["labels"])
    assert matrix.tolist() == [[10, 11, 12, 2, PAD], [20, 21, 2, PAD, 0]]


def test_empty_micro_batch_is_one_pad_row() -> None:
    batch = build_micro_batch([], packs_sequences=True, pad_token_id=PAD, pad_bucket=4)
    assert batch.tensors["input_ids"].shape == (1, 4)
    assert batch.tensors["loss_mask"].sum() == 0 and batch.layout.num_samples == 0
