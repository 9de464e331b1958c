"""``graft train`` refuses, before any model loads, a model directory without weights, a tokenizer
source without tokenizer files and a run directory it cannot write (issue 36, findings 7-9):
exit 2, a message naming the setting and the fix, no traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from graft.config import compose
from graft.config.validate import preflight
from graft.errors import ConfigError
from graft.testing.chat import write_chat_checkpoint
from graft.testing.checkpoint import save_tiny_checkpoint

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "vocab.json", "merges.txt")


def refused(run_graft, run_dir: Path, *overrides: str) -> str:
    """Run ``graft train`` with ``overrides``; assert it is refused as bad input; its stderr."""
    done = run_graft(["train", f"trainer.run_dir={run_dir}", "trainer.total_steps=1",
                      "engine.device=cpu", *overrides], timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done.stderr


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A complete local model directory: config.json, model.safetensors, tokenizer files."""
    return save_tiny_checkpoint("tiny-llama", tmp_path_factory.mktemp("tiny") / "model")


def copy_without(source: Path, target: Path, *names: str) -> Path:
    shutil.copytree(source, target)
    for name in names:
        (target / name).unlink(missing_ok=True)
    return target


# --- finding 7: config.json but no weights ---------------------------------------------------

def test_model_directory_without_weights(run_graft, tiny_model: Path, tmp_path: Path) -> None:
    model = copy_without(tiny_model, tmp_path / "model", "model.safetensors")
    stderr = refused(run_graft, tmp_path / "run", f"model.path={model}")
    assert "has config.json but no weights" in stderr and "model.safetensors" in stderr
    assert not (tmp_path / "run").exists()


def test_sharded_model_with_a_missing_shard(run_graft, tiny_model: Path, tmp_path: Path) -> None:
    model = copy_without(tiny_model, tmp_path / "model")
    (model / "model.safetensors").rename(model / "model-00001-of-00002.safetensors")
    index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                            "b": "model-00002-of-00002.safetensors"}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    stderr = refused(run_graft, tmp_path / "run", f"model.path={model}")
    assert "model-00002-of-00002.safetensors" in stderr and "1 are missing" in stderr


def test_building_a_model_without_weights_is_a_config_error(tiny_model: Path,
                                                            tmp_path: Path) -> None:
    """The library path (``graft.train(cfg)`` builds the model without `preflight`)."""
    from graft.config import ModelConfig
    from graft.models import build_model

    model = copy_without(tiny_model, tmp_path / "model", "model.safetensors")
    with pytest.raises(ConfigError, match="has config.json but no weights"):
        build_model(ModelConfig(path=str(model)))


# --- finding 8: no tokenizer files -----------------------------------------------------------

@pytest.fixture(scope="module")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3 with its tokenizer: transformers builds a 1-token Qwen2Tokenizer for a
    Qwen3 directory without tokenizer files."""
    return write_chat_checkpoint(tmp_path_factory.mktemp("chat") / "model")


def test_model_directory_without_tokenizer_files(run_graft, chat_model: Path,
                                                 tmp_path: Path) -> None:
    model = copy_without(chat_model, tmp_path / "model", *TOKENIZER_FILES)
    stderr = refused(run_graft, tmp_path / "run", f"model.path={model}")
    assert "has no tokenizer files" in stderr and "set data.tokenizer" in stderr
    cfg = compose([f"model.path={model}", f"data.tokenizer={chat_model}",
                   f"trainer.run_dir={tmp_path / 'run'}"])
    preflight(cfg)  # the fix the message names is accepted


# --- finding 9: a run directory that cannot be written --------------------------------------

@pytest.fixture
def read_only_mount(tmp_path: Path) -> Iterator[Path]:
    """A read-only tmpfs (root ignores file permissions, not a read-only mount); skips where
    this process may not mount."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)],
                             capture_output=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_run_dir_on_a_read_only_disk(run_graft, tiny_model: Path, read_only_mount: Path) -> None:
    stderr = refused(run_graft, read_only_mount / "run", f"model.path={tiny_model}")
    assert f"trainer.run_dir '{read_only_mount / 'run'}' is not writable" in stderr
    assert "Read-only file system" in stderr and "set trainer.run_dir" in stderr


def test_run_dir_below_a_file(run_graft, tmp_path: Path) -> None:
    (tmp_path / "notes").write_text("a file, not a folder\n")
    stderr = refused(run_graft, tmp_path / "notes" / "run", "trainer.mode=sft")
    assert "cannot be created" in stderr and "is a file, not a folder" in stderr
    assert (tmp_path / "notes").read_text() == "a file, not a folder\n"
