"""torch.compile's caches in a persistent folder (``engine.compile_cache_dir``): which folder, and a
second run of the same command that finds its compiled blocks there (``engine.compile=true`` on
CPU, inductor's C++ backend)."""

from __future__ import annotations

from pathlib import Path

import pytest

from graft.training.compile_cache import ENV, compile_cache_dir


def test_the_folder_is_the_setting_then_the_users_variable_then_the_xdg_cache(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir as torch_default

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(ENV, raising=False)
    assert compile_cache_dir(None) == tmp_path / "xdg" / "graft" / "torch_compile"
    monkeypatch.setenv(ENV, torch_default())  # what torch writes there once it has compiled
    assert compile_cache_dir(None) == tmp_path / "xdg" / "graft" / "torch_compile"
    monkeypatch.setenv(ENV, str(tmp_path / "mine"))
    assert compile_cache_dir(None) == tmp_path / "mine"
    assert compile_cache_dir(str(tmp_path / "set")) == tmp_path / "set"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.delenv(ENV)
    assert compile_cache_dir(None) == Path.home() / ".cache" / "graft" / "torch_compile"


@pytest.mark.slow  # two CLI runs that compile (the first ~30 s on 2 idle cores)
def test_a_second_run_finds_the_compiled_blocks_in_the_cache(run_graft, metrics_of,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    monkeypatch.delenv(ENV, raising=False)  # not set by the user: Graft picks the folder
    cache = tmp_path / "xdg" / "graft" / "torch_compile"
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    counts = []
    for run in ("cold", "warm"):
        result = run_graft(["train", f"trainer.run_dir={tmp_path / run}", "trainer.mode=sft",
                            "model.preset=tiny-llama", "engine.compile=true",
                            "trainer.total_steps=1", "checkpoint.save_at_end=false",
                            "export.hf_at_end=false"], env=env)
        assert result.returncode == 0, result.stderr[-3000:]
        assert f"compile cache {cache}" in result.stdout
        first = metrics_of(tmp_path / run)[0]
        counts.append((first["compile_cache_hits"], first["compile_cache_misses"]))
    (cold_hits, cold_misses), (warm_hits, warm_misses) = counts
    assert cold_hits == 0 and cold_misses > 0
    assert warm_hits == cold_misses and warm_misses == 0
    assert (cache / "fxgraph").is_dir() and (cache / "aotautograd").is_dir()
