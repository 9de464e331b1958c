"""Names a package exports without importing their modules until first use (PEP 562).

A package whose public names live in torch-importing modules keeps ``import <package>`` cheap by
mapping each name to its module and importing that module on the first attribute access. The core's
packages do so, and so may a plugin's entry package (its table of contents), so that discovering
plugins imports no torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(package: str, module_of: Mapping[str, str]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for ``package``: ``name`` in ``module_of`` is imported from
    the module ``module_of[name]`` when first read; any other name is an `AttributeError`.

    Use it as ``__getattr__ = lazy_attributes(__name__, {"Name": "pkg.module", ...})``.
    """

    def __getattr__(name: str) -> Any:
        if name in module_of:
            return getattr(importlib.import_module(module_of[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
