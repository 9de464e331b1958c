"""torch.compile's caches in a persistent folder, so a second run of a command compiles less.

Inductor keeps what it compiled (FX graphs' generated code, Triton kernels, autotuning results)
and AOTAutograd its joint graphs in ``TORCHINDUCTOR_CACHE_DIR``, by default a folder under
``/tmp`` that a reboot or a fresh container loses. `use_compile_cache` points it at
``engine.compile_cache_dir``, else at ``$TORCHINDUCTOR_CACHE_DIR`` when the user set it, else at
``$XDG_CACHE_HOME/graft/torch_compile`` (``~/.cache/graft/torch_compile``), and turns on the FX
graph and AOTAutograd caches (on by default in torch 2.11-2.14; set again in case a user's
config turned them off). Dynamo still traces the Python code again in every process; what the
caches save is the compilation that follows (most of a first step's compile time on a GPU, bench/README.md).

Graft writes nothing there itself: torch does, on the first compilation, and Graft never deletes
anything in it. The same folder serves any model: torch's cache keys hold the graph, the
shapes, the torch version and the device.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

ENV = "TORCHINDUCTOR_CACHE_DIR"


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/graft/torch_compile``, ``~/.cache/graft/torch_compile`` without it."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "graft" / "torch_compile"


def _user_set_dir() -> str | None:
    """``$TORCHINDUCTOR_CACHE_DIR`` unless it is torch's own default (torch writes its default
    into the variable the first time it compiles in a process)."""
    value = os.environ.get(ENV)
    if not value:
        return None
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir as torch_default

    return None if os.path.abspath(value) == os.path.abspath(torch_default()) else value


def compile_cache_dir(setting: str | None) -> Path:
    """The folder for ``engine.compile_cache_dir`` = ``setting`` (null: the user's
    ``$TORCHINDUCTOR_CACHE_DIR``, else `default_cache_dir`)."""
    chosen = setting or _user_set_dir()
    return Path(chosen).expanduser().resolve() if chosen else default_cache_dir()


def use_compile_cache(setting: str | None) -> Path:
    """Send every later compilation in this process to `compile_cache_dir` with the FX graph
    and AOTAutograd caches on; return the folder (created by torch when it first writes)."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    folder = compile_cache_dir(setting)
    os.environ[ENV] = str(folder)
    inductor_config.fx_graph_cache = True
    functorch_config.enable_autograd_cache = True
    return folder


class CacheCounters:
    """Cache hits and misses of inductor's FX graph cache and AOTAutograd's cache since it was
    made (torch counts them per process)."""

    KEYS = (("inductor", "fxgraph_cache_hit", "hits"), ("inductor", "fxgraph_cache_miss", "misses"),
            ("aot_autograd", "autograd_cache_hit", "hits"),
            ("aot_autograd", "autograd_cache_miss", "misses"))

    def __init__(self) -> None:
        self.start = self._read()

    @classmethod
    def _read(cls) -> dict[str, int]:
        from torch._dynamo.utils import counters

        totals = {"hits": 0, "misses": 0}
        for group, key, kind in cls.KEYS:
            totals[kind] += int(counters[group][key])
        return totals

    def metrics(self) -> dict[str, Any]:
        """``compile_cache_hits`` and ``compile_cache_misses`` since creation; empty when
        nothing was compiled."""
        now = self._read()
        hits, misses = (now[k] - self.start[k] for k in ("hits", "misses"))
        if hits == misses == 0:
            return {}
        return {"compile_cache_hits": hits, "compile_cache_misses": misses}
