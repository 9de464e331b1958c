"""Every plugin declares the range of graft versions whose hook contract it was written for (a
hook's signature may change between them), and the graft installed here is in that range."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

from graft import __version__

REPO = Path(__file__).resolve().parents[1]
PROJECTS = sorted([*REPO.glob("plugins/*/pyproject.toml"),
                   REPO / "docs" / "examples" / "graft_myfeature" / "pyproject.toml"])


def graft_requirement(pyproject: Path) -> Requirement:
    """The ``graft`` entry of a distribution's ``project.dependencies``."""
    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    (found,) = [r for r in map(Requirement, dependencies) if r.name == "graft"]
    return found


@pytest.mark.parametrize("pyproject", PROJECTS, ids=lambda p: p.parent.name)
def test_each_plugin_pins_the_graft_it_was_written_for(pyproject: Path) -> None:
    requirement = graft_requirement(pyproject)
    operators = {spec.operator for spec in requirement.specifier}
    assert {">=", "<"} <= operators, f"{pyproject}: pin graft to a range, >=X,<Y: {requirement}"
    assert requirement.specifier.contains(__version__), (
        f"{pyproject}: {requirement} excludes the graft here ({__version__}); when the hook "
        f"contract changed, check the plugin against it and move the range")


def test_every_plugin_is_checked() -> None:
    assert len(PROJECTS) == len(list(REPO.glob("plugins/*"))) + 1
