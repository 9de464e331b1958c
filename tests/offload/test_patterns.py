"""Module patterns: ``prefix.{*}``, per-segment globs, the family's blocks, and their errors."""

from __future__ import annotations

import pytest

from graft.errors import ConfigError
from graft.models import family_for
from graft_offload.patterns import select_modules

LAYERS = [f"model.layers.{i}" for i in range(4)]


def names(model, patterns: list[str]) -> list[str]:
    return [name for name, _ in select_modules(model, patterns, family_for("llama").decoder_blocks)]


def test_children_wildcard_expands_every_child_in_order(build_llama) -> None:
    model = build_llama()
    selected = select_modules(model, ["model.layers.{*}"], family_for("llama").decoder_blocks)
    assert [name for name, _ in selected] == LAYERS
    assert [module for _, module in selected] == list(model.model.layers)


def test_globs_match_one_segment_at_a_time(build_llama) -> None:
    model = build_llama()
    assert names(model, ["model.layers.*"]) == LAYERS
    assert names(model, ["model.layers.*.mlp"]) == [f"{n}.mlp" for n in LAYERS]
    assert names(model, ["model.layers.[13]"]) == ["model.layers.1", "model.layers.3"]


def test_pattern_order_is_block_order_and_duplicates_are_dropped(build_llama) -> None:
    model = build_llama()
    assert names(model, ["model.layers.2", "model.layers.{*}"]) == [
        "model.layers.2", "model.layers.0", "model.layers.1", "model.layers.3"]


def test_no_patterns_select_the_familys_decoder_blocks(build_llama) -> None:
    model = build_llama()
    selected = select_modules(model, [], family_for("llama").decoder_blocks)
    assert [name for name, _ in selected] == LAYERS
    assert [module for _, module in selected] == list(model.model.layers)


@pytest.mark.parametrize(("pattern", "nearest"), [
    ("model.layer.{*}", "model.layers"),
    ("model.layers.9", "model.layers."),
    ("model.layers.*.mpl", ".mlp"),
])
def test_a_pattern_matching_nothing_names_the_nearest_modules(build_llama, pattern: str,
                                                              nearest: str) -> None:
    with pytest.raises(ConfigError) as error:
        names(build_llama(), ["model.layers.{*}", pattern])
    message = str(error.value)
    assert f"the pattern {pattern!r} matches no module" in message
    assert nearest in message.split("Nearest module names:")[1]


def test_nested_selections_are_an_error(build_llama) -> None:
    with pytest.raises(ConfigError, match="selects 'model.layers.1.mlp' inside 'model.layers.1'"):
        names(build_llama(), ["model.layers.{*}", "model.layers.1.mlp"])


def test_a_family_without_blocks_needs_patterns(build_llama) -> None:
    with pytest.raises(ConfigError, match="lists no decoder blocks"):
        select_modules(build_llama(), [], lambda model: [])
