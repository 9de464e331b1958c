"""Choice fields: fixed values or registry names, declared as data in the schema and resolved
with the run's plugins when the config is validated (the schema imports no registry)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import graft.config.schema as schema
from graft.config import compose
from graft.config.compose import valid_choices
from graft.config.registries import registries, registry_names
from graft.errors import ConfigError
from graft.plugins import get_plugin_manager


def choice_fields() -> list[tuple[str, dataclasses.Field]]:
    root = schema.GraftConfig
    return [(f"{section.name}.{f.name}", f)
            for section in dataclasses.fields(root)
            for f in dataclasses.fields(section.default_factory())
            if "choices" in f.metadata]


def test_the_schema_module_imports_no_registry() -> None:
    tree = ast.parse(Path(schema.__file__).read_text())
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert all(name.startswith(("__future__", "collections", "dataclasses", "typing",
                                "graft.config.ranges"))
               for name in imported), imported


def test_every_registry_a_field_names_resolves() -> None:
    manager = get_plugin_manager()
    for dotted, f in choice_fields():
        registry = f.metadata["registry"]
        assert registry is None or registry in registries(manager), dotted
        assert f.default in valid_choices(f, manager), dotted


@pytest.mark.parametrize(("key", "names"), [
    ("trainer.mode", {"rl", "sft"}), ("rollout.engine", {"embedded"}),
    ("algorithm.advantage", {"grpo", "rloo"}), ("loss.policy_loss", {"ppo"}),
    ("algorithm.reward", {"auto", "exact_match", "positional_match"})])
def test_registry_backed_fields_list_the_registered_names(key: str, names: set[str]) -> None:
    field = dict(choice_fields())[key]
    assert names <= set(valid_choices(field, get_plugin_manager()))


def test_a_wrong_value_names_the_key_suggests_and_lists() -> None:
    with pytest.raises(ConfigError) as error:
        compose(["model.preset=tiny-lama"])
    message = str(error.value)
    assert "'model.preset' is 'tiny-lama'. Did you mean 'tiny-llama'?" in message
    assert "tiny-qwen3-moe" in message
    with pytest.raises(ConfigError, match="Did you mean 'embedded'"):
        compose(["rollout.engine=embeded"])


def test_unknown_registry_is_a_clear_error() -> None:
    with pytest.raises(KeyError, match="unknown registry 'nope'"):
        registry_names("nope", get_plugin_manager())
