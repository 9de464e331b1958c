"""Refactors that should not change results do not: the default RL run, SFT and a ``model.path``
run (CPU, seed 0, 6 steps) give the committed ``loss``, ``grad_norm``, ``entropy`` and
``reward_mean`` bit for bit (`reference_metrics.json`, written at 0cb6758 before the core's
features moved into plugins).

    python tests/core/training/test_reference_metrics.py --write   # after a deliberate change
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REFERENCE = Path(__file__).with_name("reference_metrics.json")
KEYS = ("loss", "grad_norm", "entropy", "reward_mean")
QUICK = ["trainer.total_steps=6", "checkpoint.every_steps=0", "checkpoint.save_at_end=false",
         "export.hf_at_end=false"]
RUNS = {"rl": [], "sft": ["trainer.mode=sft"], "model_path": ["model.path={model}"]}


def save_model_dir(folder: Path) -> Path:
    """A tiny Qwen3 checkpoint (seed 0) with the built-in tokenizer: what ``model.path`` loads."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from graft.data.tokenizer import builtin_tokenizer

    config = AutoConfig.for_model("qwen3", hidden_size=64, intermediate_size=128,
                                  num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=16, vocab_size=128,
                                  max_position_embeddings=1024, tie_word_embeddings=False)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    builtin_tokenizer().save_pretrained(folder)
    return folder


def run_metrics(name: str, run_dir: Path, model: Path) -> list[dict[str, float]]:
    """The ``KEYS`` of every step of run ``name`` (`RUNS`) in ``run_dir``."""
    args = [arg.format(model=model) for arg in RUNS[name]]
    subprocess.run([sys.executable, "-m", "graft", "train", f"trainer.run_dir={run_dir}",
                    *QUICK, *args], check=True, capture_output=True, text=True)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(line) for line in lines if line.strip()]
    return [{key: step[key] for key in KEYS if key in step} for step in steps if step["step"] > 0]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNS))
def test_metrics_equal_the_reference_bit_for_bit(name: str, tmp_path: Path) -> None:
    expected = json.loads(REFERENCE.read_text())[name]
    got = run_metrics(name, tmp_path / "run", save_model_dir(tmp_path / "model"))
    assert got == expected


def write_reference(folder: Path) -> None:
    """Run every `RUNS` entry under ``folder`` and write `REFERENCE`."""
    model = save_model_dir(folder / "model")
    reference = {name: run_metrics(name, folder / name, model) for name in RUNS}
    REFERENCE.write_text(json.dumps(reference, indent=1) + "\n")


if __name__ == "__main__":
    import tempfile

    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    with tempfile.TemporaryDirectory() as tmp:
        write_reference(Path(tmp))
