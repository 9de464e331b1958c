"""`graft.lazy_attributes`: a package's public names imported from their modules on first use."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from graft import lazy_attributes


def test_a_name_is_imported_from_its_module_on_first_access(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "lazy_pkg"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from graft import lazy_attributes\n"
        "__getattr__ = lazy_attributes(__name__, {'heavy_value': 'lazy_pkg.heavy'})\n")
    (package / "heavy.py").write_text("heavy_value = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import lazy_pkg

    assert "lazy_pkg.heavy" not in sys.modules
    assert lazy_pkg.heavy_value == 42
    assert "lazy_pkg.heavy" in sys.modules
    for name in ("lazy_pkg", "lazy_pkg.heavy"):
        sys.modules.pop(name, None)


def test_an_unknown_name_is_an_attribute_error_naming_the_package() -> None:
    import json

    getattr_ = lazy_attributes("some.package", {"dumps": "json"})
    assert getattr_("dumps") is json.dumps
    with pytest.raises(AttributeError, match="'some.package' has no attribute 'unknown'"):
        getattr_("unknown")


def test_importing_graft_and_the_plugins_entry_packages_imports_no_torch() -> None:
    code = ("import sys, graft, graft.engine, graft.export, graft.rollout, graft_offload, "
            "graft_exact, graft_router_replay\n"
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)[:5]")
    subprocess.run([sys.executable, "-c", code], check=True)
