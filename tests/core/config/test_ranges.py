"""Every numeric setting has an allowed range, and a value outside it is a config error (exit 2)
naming the key and the range: the schema is walked, core and every installed plugin's section."""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Iterator

import pytest

from graft import hookimpl
from graft.cli.main import main
from graft.config import Range, bounded, compose, schema_config
from graft.config.ranges import field_range
from graft.errors import ConfigError
from graft.plugins import GraftPluginManager

NUMBERS = (int, float)


def _numeric_kind(annotation: typing.Any) -> str | None:
    """``scalar``, ``list`` or None (not numeric) for a field's resolved type."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if annotation in NUMBERS or (typing.get_origin(annotation) in (typing.Union, type(int | None))
                                 and len(args) == 1 and args[0] in NUMBERS):
        return "scalar"
    if typing.get_origin(annotation) is list and args and args[0] in NUMBERS:
        return "list"
    return None


def numeric_fields(schema: type, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field, str]]:
    """``(dotted key, field, kind)`` for every numeric field below the dataclass ``schema``."""
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        annotation = hints[f.name]
        if dataclasses.is_dataclass(annotation):
            yield from numeric_fields(annotation, f"{prefix}{f.name}.")
        elif (kind := _numeric_kind(annotation)) is not None:
            yield f"{prefix}{f.name}", f, kind


FIELDS = list(numeric_fields(schema_config()[0]))


@dataclasses.dataclass
class DialConfig:
    turns: int = bounded(3, ge=1)


class Dial:
    """A plugin with a numeric setting of its own, so the walk has a plugin section to find
    whichever plugins are installed (none under ``GRAFT_PLUGINS=``)."""

    @hookimpl
    def graft_config_sections(self):
        return [("dial", DialConfig)]


def test_the_walk_finds_core_and_plugin_sections() -> None:
    manager = GraftPluginManager()
    manager.load(allowlist=[])
    manager.register(Dial(), "dial")
    keys = {key for key, _, _ in numeric_fields(schema_config(manager)[0])}
    assert {"optim.lr", "optim.betas", "trainer.total_steps", "rollout.prompts_per_step",
            "loss.clip_ratio_c", "features.dial.turns"} <= keys


@pytest.mark.parametrize("key,f,kind", FIELDS, ids=[key for key, _, _ in FIELDS])
def test_every_numeric_setting_declares_a_range(key: str, f: dataclasses.Field, kind: str) -> None:
    assert field_range(f) is not None, (
        f"{key} is numeric but has no range: declare it with graft.config.bounded(...)")


@pytest.mark.parametrize("key,f,kind", FIELDS, ids=[key for key, _, _ in FIELDS])
def test_a_value_outside_the_range_names_the_key_and_the_range(key: str, f: dataclasses.Field,
                                                                kind: str) -> None:
    allowed = field_range(f)
    if allowed is None:
        pytest.skip("no range (the test above fails)")
    outside = allowed.outside_example()
    value = f"[{outside}]" if kind == "list" else str(outside)
    with pytest.raises(ConfigError) as error:
        compose([f"{key}={value}"])
    assert f"{key!r}" in str(error.value)
    assert allowed.describe() in str(error.value)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_floats_must_be_finite(value: str) -> None:
    with pytest.raises(ConfigError, match=r"'optim.lr' is .*: it must be >= 0"):
        compose([f"optim.lr={value}"])


def test_the_defaults_and_null_for_optional_settings_are_in_range() -> None:
    cfg = compose(["loss.clip_ratio_c=null", "export.bucket_mb=null"])
    assert cfg.loss.clip_ratio_c is None and cfg.export.bucket_mb is None


@pytest.mark.parametrize("override,message", [
    ("trainer.total_steps=-5", "'trainer.total_steps' is -5: it must be >= 1"),
    ("optim.lr=-1", "'optim.lr' is -1.0: it must be >= 0"),
    ("rollout.prompts_per_step=0", "'rollout.prompts_per_step' is 0: it must be >= 1"),
    ("optim.betas=[0.9,1.0]", "'optim.betas' is [0.9, 1.0]: it must be (each element) in [0, 1)"),
])
def test_train_refuses_out_of_range_values_with_exit_2(override: str, message: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", override]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_range_descriptions() -> None:
    assert Range(low=0, low_inclusive=False).describe() == "> 0"
    assert Range(low=0.0, high=1.0, high_inclusive=False).describe() == "in [0, 1)"
    assert Range(high=5).describe() == "<= 5"
    assert not Range(low=1).contains(True)  # a bool is not a number here
    with pytest.raises(ValueError, match="at most one lower bound"):
        bounded(1, ge=0, gt=0)
    assert math.isnan(Range().outside_example())
