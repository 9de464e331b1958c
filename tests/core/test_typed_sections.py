"""Typed config sections: ``graft.engine``, ``graft.rollout`` and ``graft.rl`` take the config
they read as a typed parameter, never as ``Any``.

Every module under those packages is parsed (``ast``). A config parameter is one named ``cfg``,
``config`` or ``*_cfg`` / ``*_config``, or one whose annotation names a config class (a name
ending in ``Config``: the sections of `graft.config.schema` such as ``EngineConfig``, or the
root ``GraftConfig``); a dataclass field named like one counts too. Each must be annotated, and
not with ``Any`` (alone, or in a union such as ``Any | None``; ``dict[str, Any]`` is a typed
container, not ``Any``). A function that only reads sections takes them (``engine:
EngineConfig``); one that hands the config on to plugin hooks or registry factories, which get
the root config so a plugin can read its ``features.<name>`` section, takes ``cfg: GraftConfig``.
At run time these are OmegaConf configs structured from those dataclasses: the annotation is for
readers and type checkers.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "core" / "src" / "graft"
PACKAGES = ("engine", "rollout", "rl")


def is_config_name(name: str) -> bool:
    """Whether a parameter's name says it is a config."""
    return name in ("cfg", "config") or name.endswith(("_cfg", "_config"))


def annotation_node(annotation: ast.expr | None) -> ast.expr | None:
    """The annotation as an expression (a string annotation parsed)."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            return ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return None
    return annotation


def names_in(annotation: ast.expr | None) -> set[str]:
    """Every name an annotation mentions (``typing.Any`` -> ``Any``)."""
    node = annotation_node(annotation)
    if node is None:
        return set()
    return ({n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            | {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)})


def is_any(annotation: ast.expr | None) -> bool:
    """Whether the annotation is ``Any``, or a union or ``Optional`` with ``Any`` in it."""
    node = annotation_node(annotation)
    if node is None:
        return False
    if isinstance(node, ast.Name | ast.Attribute):
        return (node.id if isinstance(node, ast.Name) else node.attr) == "Any"
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return is_any(node.left) or is_any(node.right)
    if isinstance(node, ast.Subscript) and names_in(node.value) & {"Optional", "Union"}:
        parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        return any(is_any(part) for part in parts)
    return False


def is_config(name: str, annotation: ast.expr | None) -> bool:
    """Whether a parameter or field is a config: by its name or its annotation."""
    return is_config_name(name) or any(n.endswith("Config") for n in names_in(annotation))


def untyped_configs(source: str, where: str) -> list[str]:
    """``where:line name(param: annotation)`` of every config parameter or dataclass field
    of ``source`` that is unannotated or annotated ``Any``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            args = node.args
            params = [*args.posonlyargs, *args.args, *args.kwonlyargs,
                      *[a for a in (args.vararg, args.kwarg) if a is not None]]
            owner = getattr(node, "name", "lambda")
            items = [(p.arg, p.annotation, p.lineno) for p in params]
        elif isinstance(node, ast.ClassDef):
            owner = node.name
            items = [(s.target.id, s.annotation, s.lineno) for s in node.body
                     if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
        else:
            continue
        for name, annotation, line in items:
            if is_config(name, annotation) and (annotation is None or is_any(annotation)):
                shown = ast.unparse(annotation) if annotation is not None else "unannotated"
                found.append(f"{where}:{line} {owner}({name}: {shown})")
    return found


def test_engine_rollout_and_rl_take_typed_config_sections() -> None:
    modules = [path for package in PACKAGES for path in sorted((CORE / package).rglob("*.py"))]
    assert len(modules) > 10  # the packages are where this test looks
    found = [hit for path in modules
             for hit in untyped_configs(path.read_text(), str(path.relative_to(CORE)))]
    assert not found, (f"{len(found)} config parameter(s) typed Any or not at all; take the "
                       f"sections read (engine: EngineConfig) or, to hand the config to plugins, "
                       f"cfg: GraftConfig (graft.config.schema): " + "; ".join(found))


@pytest.mark.parametrize(("source", "count"), [
    ("def f(cfg: Any) -> None: ...", 1),
    ("def f(model, *, cfg=None) -> None: ...", 1),
    ("def f(*, cfg: 'Any | None' = None) -> None: ...", 1),
    ("def f(loss_cfg: typing.Optional[Any]) -> None: ...", 1),
    ("class Engine:\n    cfg: Any\n", 1),
    ("def f(*, engine: EngineConfig, cfg: GraftConfig | None = None) -> None: ...", 0),
    ("def f(config: dict[str, Any], model: Any, **kwargs: Any) -> None: ...", 0),
    ("f = lambda cfg: cfg", 1),
])
def test_the_scan_counts_untyped_configs(source: str, count: int) -> None:
    assert len(untyped_configs(source, "m.py")) == count
