"""The core's layering: ``graft.config`` is a leaf, and no two of the core's packages import
each other, directly or around a circle.

Every module of ``core/src/graft`` is parsed (``ast``) and every import counts, at module level,
inside a function (a lazy import is still a dependency) or under ``TYPE_CHECKING``. An import
is mapped to the top-level package or module it reads (``graft.engine.train_engine`` ->
``graft.engine``; ``from graft import hookspecs`` -> ``graft.hookspecs``).

No module is exempt: the package ``graft`` itself (its ``__init__``, the composition root that
tells ``graft.config`` where the process's plugin manager is) is imported by no core module,
and ``graft.hookspecs``, ``graft.errors`` and ``graft._version`` import no graft package, so
none of them can close a circle. ``graft.testing`` (helpers for plugins' tests) may import
every package; a package importing it would be a circle like any other.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "core" / "src" / "graft"
LEAF_CONFIG_MAY_IMPORT = {"graft.config", "graft.errors"}


def module_name(path: Path, root: Path = CORE) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit(name: str) -> str:
    """The top-level package or module ``name`` belongs to (``graft`` for the package itself)."""
    return ".".join(name.split(".")[:2])


def imported(tree: ast.AST, module: str, is_package: bool) -> list[tuple[str, int]]:
    """Every graft module or name ``tree`` imports, absolute, with its line."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[:len(module.split(".")) + is_package - node.level]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            # `from graft import hookspecs` reads the module graft.hookspecs
            found += [(f"{source}.{alias.name}" if source == "graft" else source, node.lineno)
                      for alias in node.names]
    return sorted({(name, line) for name, line in found if name.split(".")[0] == "graft"})


def package_graph(root: Path = CORE) -> dict[str, dict[str, list[str]]]:
    """``{unit: {imported unit: ["module:line", ...]}}`` over every module under ``root``."""
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(root.rglob("*.py")):
        module = module_name(path, root)
        for name, line in imported(ast.parse(path.read_text()), module,
                                   path.name == "__init__.py"):
            if unit(name) != unit(module):
                graph[unit(module)][unit(name)].append(f"{module}:{line}")
    return graph


def circles(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """The strongly connected groups of more than one unit (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, {}):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while (member := stack.pop()) != node:
                group.append(member)
            if group:
                found.append(sorted([node, *group]))

    for node in list(graph):
        if node not in index:
            visit(node)
    return found


def test_config_is_a_leaf() -> None:
    """``graft.config`` imports no graft package but ``graft.errors``: each package registers its
    rules, checks and registries through the hooks, and the config gets the plugin manager."""
    wrong = {target: sites for target, sites in package_graph()["graft.config"].items()
             if target not in LEAF_CONFIG_MAY_IMPORT}
    assert not wrong, f"graft.config imports other graft packages: {wrong}"


def test_no_import_circle_in_the_core() -> None:
    graph = package_graph()
    found = circles(graph)
    assert not found, "import circles between the core's packages: " + "; ".join(
        " <-> ".join(group) + " (" + ", ".join(f"{a} -> {b}: {graph[a][b][0]}" for a in group
                                              for b in group if b in graph[a]) + ")"
        for group in found)


@pytest.mark.parametrize(("files", "expected"), [
    ({"a/__init__.py": "", "a/x.py": "from graft.b.y import f", "b/__init__.py": "",
      "b/y.py": "def g():\n    from graft.a import x"}, [["graft.a", "graft.b"]]),
    ({"a/__init__.py": "from . import x", "a/x.py": "from ..b import y", "b/__init__.py": "",
      "b/y.py": "import graft.c"}, []),
])
def test_the_scan_finds_lazy_and_relative_circles(tmp_path: Path, files: dict[str, str],
                                                  expected: list[list[str]]) -> None:
    root = tmp_path / "graft"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    assert circles(package_graph(root)) == expected
