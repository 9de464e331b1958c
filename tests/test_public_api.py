"""Plugins import only graft's public API.

Public, precisely: a name listed in the literal ``__all__`` of ``graft`` itself or of a module
one level below it (a package ``graft/<x>/__init__.py`` or a module ``graft/<x>.py``). Any deeper
module path (``graft.engine.distributed.parallelize``) is the core's own and may change without notice. The
check parses (AST) the sources of every plugin built as a third party would build one: this
repository's ``plugins/*/src``, the test plugins under ``tests/plugins`` and the documented
example plugin.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CORE = REPO / "core" / "src" / "graft"

# Violations that exist today in plugins other helpers are switching to the public names
# (graft.engine re-exports them). This list must shrink to empty: the test below fails when an
# entry no longer occurs, so remove it as the plugin is fixed. Entries: (file, module, name).
KNOWN_VIOLATIONS: set[tuple[str, str, str]] = set()


def plugin_sources() -> list[Path]:
    """Every Python file of a plugin distribution's package (not its tests)."""
    roots = [*REPO.glob("plugins/*/src"), *REPO.glob("tests/plugins/*"),
             *REPO.glob("docs/examples/*/graft_*")]
    return sorted(path for root in roots if root.is_dir() for path in root.rglob("*.py")
                  if "tests" not in path.relative_to(root).parts and "build" not in path.parts)


def literal_all(path: Path) -> list[str] | None:
    """The literal ``__all__`` a module's source assigns, or None when it has none."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                return list(ast.literal_eval(node.value))
    return None


def public_api() -> dict[str, set[str]]:
    """Public module -> its public names: ``graft`` and every ``graft.<x>`` with an ``__all__``."""
    api = {"graft": set(literal_all(CORE / "__init__.py") or ())}
    for path in sorted(CORE.iterdir()):
        source = path / "__init__.py" if path.is_dir() else path
        if path.name.startswith("_") or source.suffix != ".py" or not source.exists():
            continue
        names = literal_all(source)
        if names is not None:
            api[f"graft.{path.stem if path.is_file() else path.name}"] = set(names)
    return api


def private_imports(source: str, api: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(module, name) of every graft import in ``source`` that is not public API; name is ``*``
    for a whole-module import or a star import, or the attribute a ``graft.x.y`` chain reads."""
    found: list[tuple[str, str]] = []
    tree = _with_parents(ast.parse(source))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.split(".")[0] == "graft":
            public = api.get(node.module)
            for alias in node.names:
                if public is None or alias.name not in public:
                    found.append((node.module, alias.name))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "graft" and alias.name != "graft" and \
                        alias.name not in api:
                    found.append((alias.name, "*"))
        elif isinstance(node, ast.Attribute) and not isinstance(getattr(node, "parent", None),
                                                                ast.Attribute):
            found.extend(_private_attribute(node, api))
    return found


def _private_attribute(node: ast.Attribute, api: dict[str, set[str]]) -> list[tuple[str, str]]:
    """A ``graft.a.b`` attribute chain that reads past the public API (``graft.engine.phase``)."""
    parts: list[str] = []
    current: ast.expr = node
    while isinstance(current, ast.Attribute):
        parts.insert(0, current.attr)
        current = current.value
    if not isinstance(current, ast.Name) or current.id != "graft":
        return []
    module = "graft"
    for part in parts:
        if part in api.get(module, set()):
            return []
        if f"{module}.{part}" in api and module == "graft":
            module = f"{module}.{part}"
            continue
        return [(module, part)]
    return []


def _with_parents(tree: ast.AST) -> ast.AST:
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            child.parent = parent  # type: ignore[attr-defined]
    return tree


def violations() -> set[tuple[str, str, str]]:
    api = public_api()
    found = set()
    for path in plugin_sources():
        for module, name in private_imports(path.read_text(), api):
            found.add((str(path.relative_to(REPO)), module, name))
    return found


def test_plugins_import_only_public_names() -> None:
    new = sorted(violations() - KNOWN_VIOLATIONS)
    assert not new, ("plugins import graft names outside the public API (a name in the __all__ "
                     "of graft or of a graft.<x> package): " + "; ".join(
                         f"{file}: {module}.{name}" for file, module, name in new)
                     + ". Import the public re-export, or make the name public in the core.")


def test_the_documented_plugins_tests_import_only_public_names() -> None:
    """docs/plugins.md's example plugin tests itself through the public API (``graft.testing``
    has what a registry plugin's tests call), as a plugin author's tests would."""
    tests = sorted(REPO.glob("docs/examples/*/tests/*.py"))
    assert tests
    api = public_api()
    found = [f"{path.relative_to(REPO)}: {module}.{name}" for path in tests
             for module, name in private_imports(path.read_text(), api)]
    assert not found, "the example's tests import names outside the public API: " + "; ".join(found)


def test_what_plugin_authors_need_is_public() -> None:
    """The names docs/plugins.md sends plugin authors to: the trainer-mode job's protocol and
    the helpers of a registry plugin's tests."""
    api = public_api()
    assert "TrainingJob" in api["graft"]
    assert {"AggregationContext", "aggregate_loss", "advantage_estimators",
            "compute_advantages"} <= api["graft.testing"]


def test_the_known_violations_list_only_shrinks() -> None:
    fixed = sorted(KNOWN_VIOLATIONS - violations())
    assert not fixed, f"fixed: remove from KNOWN_VIOLATIONS: {fixed}"


def test_the_scan_sees_every_plugin() -> None:
    files = {path.relative_to(REPO).parts[:2] for path in plugin_sources()}
    for name in ("offload", "router_replay", "gpt_oss", "deepseek_v4", "calculator", "vllm"):
        assert ("plugins", name) in files


@pytest.mark.parametrize("source, expected", [
    ("from graft.engine.distributed.parallelize import apply_fsdp", [("graft.engine.distributed.parallelize",
                                                          "apply_fsdp")]),
    ("from graft.engine import apply_fsdp, _MODULE_OF", [("graft.engine", "_MODULE_OF")]),
    ("from graft import errors", [("graft", "errors")]),
    ("import graft.engine.phase", [("graft.engine.phase", "*")]),
    ("import graft\nx = graft.engine.phase.UPDATE", [("graft.engine", "phase")]),
    ("def f():\n    from graft.models.builtin import routers_at",
     [("graft.models.builtin", "routers_at")]),
    ("from graft.engine import apply_fsdp\nfrom graft.errors import ConfigError\n"
     "import graft\nx = graft.engine.UPDATE\nfrom graft_x.y import z\nfrom .a import b", []),
])
def test_the_scan_flags_private_names(source: str, expected: list[tuple[str, str]]) -> None:
    assert private_imports(source, public_api()) == expected


def test_every_public_name_resolves_and_callables_have_docstrings() -> None:
    for module_name, names in public_api().items():
        module = importlib.import_module(module_name)
        for name in sorted(names):
            value = getattr(module, name)  # AttributeError: __all__ lists a missing name
            if inspect.isfunction(value) or inspect.isclass(value):
                assert inspect.getdoc(value), f"{module_name}.{name} has no docstring"
