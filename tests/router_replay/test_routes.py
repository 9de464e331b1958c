"""Storage and the row rule: int16 ids checked against the expert count, duplicate rows."""

from __future__ import annotations

import pytest
import torch

from graft.engine.batch.micro_batch import PackedLayout, Segment
from graft_router_replay.routes import (
    RouteError,
    bytes_per_token,
    duplicate_rows,
    native_rows,
    real_tokens,
    to_routes,
)


def test_ids_above_255_are_kept_exactly_as_int16() -> None:
    ids = torch.tensor([[[511, 256], [300, 0]]])
    routes = to_routes(ids, num_experts=512)
    assert routes.dtype == torch.int16 and torch.equal(routes.long(), ids)
    with pytest.raises(RouteError, match=r"\[0, 512\], outside the model's 512 experts"):
        to_routes(torch.tensor([[0, 512]]), num_experts=512)
    with pytest.raises(RouteError, match="outside"):
        to_routes(torch.tensor([[-1, 3]]), num_experts=512)


def test_rows_with_a_repeated_id_or_no_route_route_natively() -> None:
    routes = torch.tensor([[[1, 2], [3, 3]], [[0, 0], [4, 5]], [[6, 7], [7, 6]]], dtype=torch.int16)
    assert duplicate_rows(routes).tolist() == [[False, True], [True, False], [False, False]]
    valid = torch.tensor([True, True, False])
    assert native_rows(routes, valid).tolist() == [[False, True], [True, False], [True, True]]


def test_real_tokens_and_bytes_follow_the_layout() -> None:
    layout = PackedLayout((Segment(0, 0, 0, 3), Segment(1, 0, 3, 2)), 1, 8, 3)
    assert real_tokens(layout).tolist() == [[True] * 5 + [False] * 3]
    routes = torch.zeros(1, 8, 48, 8, dtype=torch.int16)
    assert bytes_per_token(routes, torch.zeros(1, 8, dtype=torch.bool)) == 48 * 8 * 2 + 1
