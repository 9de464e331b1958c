"""The real-checkpoint leg of the conformance kit: a plugin on the path real users take.

A preset run builds its model with real parameters on every rank; a ``model.path`` run builds it
on the meta device, shards it and fills it from rank 0's read of the files (``graft_pre_shard``
sees meta parameters there). A plugin that works on presets can do nothing, or fail, on that
path. `check_plugin_on_checkpoint` runs a few steps both ways through the ``graft train``
command, on one rank or several (torchrun, gloo on CPU):

1. `save_tiny_checkpoint` saves the preset's tiny model (initialised as a run with the same
   ``trainer.seed`` initialises it) and Graft's built-in tokenizer as a Hugging Face directory;
2. ``graft train model.path=DIR <overrides>`` must exit 0 and report every metric of
   ``expect_metrics`` at every step;
3. the same run on ``model.preset`` must report the same values of the run's results (loss,
   gradient norm, entropy, ..., `COMPARED`) at every step: same weights, same data, same
   plugin, so a plugin whose effect depends on where the model came from fails here.

Runs are small by default (`SMALL_RUN`: 2 prompts or samples per rank, 2 samples per prompt).
The responses are sampled with a tiny ``top_p`` (greedy) so that both legs generate the same
tokens: a preset's initialisation draws from the global RNG, a checkpoint's load does not, so
sampled responses (and every RL metric after them) would otherwise differ.

A third-party plugin's test::

    from graft.testing.checkpoint import check_plugin_on_checkpoint

    @pytest.mark.parametrize("nproc", [1, 2])
    def test_my_feature_on_a_checkpoint(tmp_path, nproc):
        check_plugin_on_checkpoint(preset="tiny-llama", nproc=nproc, tmp_path=tmp_path,
                                   overrides=["features.myfeature.enabled=true"],
                                   expect_metrics=["myfeature/applied"])
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

# Metrics both legs must agree on at every step (those a run reports); timings never compare.
COMPARED = ("loss", "grad_norm", "entropy", "tokens", "response_length", "reward_mean",
            "train_infer_logprob_diff")


def small_run(nproc: int, steps: int, seed: int) -> list[str]:
    """The overrides every leg starts from (the caller's come after and win): ``steps`` steps
    on CPU of 2 prompts (SFT: samples) per rank, 2 samples per prompt, greedy responses, no
    checkpoint or export."""
    return [f"trainer.total_steps={steps}", f"trainer.seed={seed}", "engine.device=cpu",
            f"rollout.prompts_per_step={2 * nproc}", "rollout.n=2", "rollout.top_p=0.000001",
            f"trainer.global_batch_size={2 * nproc}", "data.num_samples=64",
            "checkpoint.save_at_end=false", "checkpoint.every_steps=0", "export.hf_at_end=false"]


def save_tiny_checkpoint(preset: str, folder: str | Path, *, seed: int = 0) -> Path:
    """Save ``preset``'s model, initialised from ``seed`` as ``graft train model.preset=PRESET
    trainer.seed=SEED`` initialises it, with Graft's built-in tokenizer, as a Hugging Face
    directory (``config.json``, ``model.safetensors``, tokenizer files) that ``model.path``
    loads; return the folder."""
    from graft.config import ModelConfig
    from graft.data.tokenizer import load_tokenizer
    from graft.models import build_model

    folder = Path(folder)
    model, _ = build_model(ModelConfig(preset=preset), seed=seed)
    model.save_pretrained(folder)
    load_tokenizer(None, None).save_pretrained(folder)
    return folder


def run_graft(args: Sequence[str], *, env: Mapping[str, str] | None = None,
              timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    """``python -m graft ARGS`` with its output (stdout and stderr together) captured.

    ``env`` is added to the environment (a ``PYTHONPATH`` in it goes in front of the inherited
    one). A run still going after ``timeout_s`` seconds (a hang) is stopped and is an
    `AssertionError` with the output's tail: SIGTERM to the command's process group (torchrun
    then stops its ranks, which run in sessions of their own), SIGKILL 30 s later.
    """
    command = [sys.executable, "-m", "graft", *args]
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True, env=_environment(env))
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop(process)
            log.seek(0)
            raise AssertionError(f"{' '.join(command)} still ran after {timeout_s:.0f} s:\n"
                                 f"{log.read()[-4000:]}") from None
        log.seek(0)
        return subprocess.CompletedProcess(command, process.returncode, log.read())


def _environment(extra: Mapping[str, str] | None) -> dict[str, str]:
    """This process's environment with ``extra`` set; a ``PYTHONPATH`` in ``extra`` goes in
    front of the inherited one instead of replacing it."""
    env = {**os.environ, **(extra or {})}
    inherited = os.environ.get("PYTHONPATH")
    if extra and "PYTHONPATH" in extra and inherited:
        env["PYTHONPATH"] = os.pathsep.join([extra["PYTHONPATH"], inherited])
    return env


def _stop(process: subprocess.Popen[str], grace_s: float = 30) -> None:
    """SIGTERM to the process group of ``process``; SIGKILL what is left of it after
    ``grace_s`` seconds (torchrun, given the time, stops the ranks it started)."""
    os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _group_alive(process):
        time.sleep(0.5)
    if _group_alive(process):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _group_alive(process: subprocess.Popen[str]) -> bool:
    process.poll()  # reap the launcher itself once it exits
    try:
        os.killpg(process.pid, 0)
    except ProcessLookupError:
        return False
    return True


def run_graft_train(overrides: Sequence[str], run_dir: Path, *, nproc: int = 1,
                    env: Mapping[str, str] | None = None, timeout_s: float = 600) -> list[dict]:
    """``graft train [--nproc N] trainer.run_dir=RUN_DIR OVERRIDES`` (`run_graft`), which must
    exit 0; its metrics, one dict per step (``metrics.jsonl``)."""
    args = ["train", *(["--nproc", str(nproc)] if nproc > 1 else []),
            f"trainer.run_dir={run_dir}", *overrides]
    result = run_graft(args, env=env, timeout_s=timeout_s)
    assert result.returncode == 0, (f"graft {' '.join(args)} exited {result.returncode}:\n"
                                    f"{result.stdout[-4000:]}")
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def assert_metrics_every_step(rows: list[dict], expect_metrics: Sequence[str], steps: int,
                              leg: str) -> None:
    """Every step ``1..steps`` has a row, and each row a finite value of each expected metric."""
    assert [row["step"] for row in rows] == list(range(1, steps + 1)), (
        f"{leg}: metrics.jsonl has steps {[row['step'] for row in rows]}, expected 1..{steps}")
    for row in rows:
        missing = [name for name in expect_metrics if name not in row]
        assert not missing, (f"{leg}: step {row['step']} does not report {missing} (it reports "
                             f"{sorted(row)}): the plugin did not act on this run")
        bad = [name for name in expect_metrics if not math.isfinite(float(row[name]))]
        assert not bad, f"{leg}: step {row['step']}: {bad} not finite: {[row[n] for n in bad]}"


def assert_legs_agree(checkpoint: list[dict], preset: list[dict],
                      compared: Sequence[str] = COMPARED) -> None:
    """Both legs report the same value of every metric in ``compared`` that either reports
    (exactly: same weights, data and seed give the same numbers), step by step."""
    for from_path, from_preset in zip(checkpoint, preset, strict=True):
        for name in compared:
            if name not in from_path and name not in from_preset:
                continue
            a, b = from_path.get(name), from_preset.get(name)
            assert a == b, (f"step {from_path['step']}: {name} is {a} from model.path but {b} "
                            f"from model.preset (same weights): the plugin acts differently on a "
                            f"checkpoint's meta-built, sharded, broadcast-filled model")


def check_plugin_on_checkpoint(*, preset: str, overrides: Sequence[str],
                               expect_metrics: Sequence[str], nproc: int, tmp_path: str | Path,
                               steps: int = 3, seed: int = 0,
                               env: Mapping[str, str] | None = None,
                               compared: Sequence[str] = COMPARED, compare_preset: bool = True,
                               timeout_s: float = 600) -> tuple[list[dict], list[dict]]:
    """Run the plugin (enabled by ``overrides``) for ``steps`` steps on ``nproc`` ranks from a
    saved checkpoint of ``preset`` and from the preset itself; `AssertionError` unless both
    exit 0, both report every metric of ``expect_metrics`` at every step, and they agree on
    the ``compared`` metrics at every step.

    ``compare_preset=False`` runs the checkpoint leg alone (its metrics checked; the preset
    leg's list is then empty): half the time, for a second rank count whose preset leg adds
    little. ``env`` is added to the runs' environment (``PYTHONPATH`` of a plugin not
    installed, say); ``tmp_path`` holds the checkpoint and the run folders. Returns the legs'
    metrics, ``(checkpoint, preset)``, for further checks.
    """
    root = Path(tmp_path)
    folder = save_tiny_checkpoint(preset, root / "checkpoint", seed=seed)
    base = small_run(nproc, steps, seed)
    from_path = run_graft_train([*base, f"model.path={folder}", *overrides],
                                root / "from_checkpoint", nproc=nproc, env=env,
                                timeout_s=timeout_s)
    assert_metrics_every_step(from_path, expect_metrics, steps, "model.path")
    if not compare_preset:
        return from_path, []
    from_preset = run_graft_train([*base, f"model.preset={preset}", *overrides],
                                  root / "from_preset", nproc=nproc, env=env, timeout_s=timeout_s)
    assert_metrics_every_step(from_preset, expect_metrics, steps, "model.preset")
    assert_legs_agree(from_path, from_preset, compared)
    return from_path, from_preset
