"""graft-async-rl: rollout workers on ranks of their own (real torchrun runs, gloo, tiny
preset), against the colocated mode, with the staleness bound checked, and resumed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from graft.errors import ConfigError
from graft.testing import check_installed_plugin
from graft_async_rl import split_ranks, version_for

# Short runs that learn visibly (the default task) and keep every step's record.
RUN = ["checkpoint.save_at_end=false", "export.hf_at_end=false", "rollout.seeded_sampling=true"]
COMPARED = ("loss", "grad_norm", "entropy", "reward_mean", "response_length")
TIMINGS = ("time", "_s", "per_s", "idle_share", "peak_memory", "compile_cache")


def workers(count: int, staleness: int) -> list[str]:
    return [f"features.async_rl.workers={count}", f"features.async_rl.max_staleness={staleness}"]


def deterministic(row: dict) -> dict:
    """A metrics row without what depends on the clock."""
    return {k: v for k, v in row.items() if not any(part in k for part in TIMINGS)}


def test_the_plugin_conforms() -> None:
    assert check_installed_plugin("async_rl") == [
        "graft_config_rules", "graft_config_sections", "graft_experience_source",
        "graft_rank_roles", "graft_role_runner"]


def test_the_last_ranks_generate_each_on_its_own() -> None:
    assert split_ranks(4, 2) == {"trainer": [0, 1], "rollout.0": [2], "rollout.1": [3]}
    with pytest.raises(ConfigError, match=r"workers=2 leaves no rank to train.*--nproc 3"):
        split_ranks(2, 2)


@pytest.mark.parametrize("step,k,version", [(1, 0, 0), (5, 0, 4), (1, 2, 0), (3, 2, 0),
                                            (4, 2, 1), (9, 4, 4)])
def test_a_step_is_generated_by_the_weights_k_updates_before_its_own(step: int, k: int,
                                                                     version: int) -> None:
    assert version_for(step, k) == version


@pytest.mark.slow
def test_on_policy_workers_sample_and_train_as_the_colocated_ranks_do(
        graft_train, metrics_of, tmp_path: Path) -> None:
    # with a correction on both sides, which on-policy weighs every token by about 1
    steps = ["trainer.total_steps=3", "checkpoint.every_steps=0",
             "algorithm.rollout_correction=tis"]
    graft_train(tmp_path / "colocated", *RUN, *steps, nproc=2)
    graft_train(tmp_path / "workers", *RUN, *steps, *workers(1, 0), nproc=3)
    colocated, separate = metrics_of(tmp_path / "colocated"), metrics_of(tmp_path / "workers")
    for row, other in zip(colocated, separate, strict=True):
        for name in (*COMPARED, "rollout_correction/weight_mean"):
            assert other[name] == pytest.approx(row[name], abs=1e-6), (row["step"], name)
        assert other["async_rl/staleness_max"] == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 4])
def test_stale_workers_learn_as_colocated_within_the_bound_and_resume_bit_exactly(
        graft_train, metrics_of, tmp_path: Path, k: int) -> None:
    steps = ["trainer.total_steps=12", "checkpoint.every_steps=6"]
    graft_train(tmp_path / "colocated", *RUN, *steps, nproc=2)
    graft_train(tmp_path / "run", *RUN, *steps, *workers(1, k), nproc=3)
    colocated, rows = metrics_of(tmp_path / "colocated"), metrics_of(tmp_path / "run")
    assert abs(rise(rows) - rise(colocated)) <= 0.1
    for row in rows:  # every trained token at most k updates old, and corrected for it
        assert row["async_rl/staleness_max"] == min(k, row["step"] - 1) <= k
        assert "rollout_correction/weight_mean" in row, sorted(row)  # tis, fitted by default

    # Interrupted after step 6's checkpoint: the copy resumes from it and trains on the same
    # samples (those the workers generated ahead are in the checkpoint).
    shutil.copytree(tmp_path / "run", tmp_path / "resumed")
    graft_train(tmp_path / "resumed", *RUN, *steps, *workers(1, k),
                f"checkpoint.resume={tmp_path / 'resumed' / 'checkpoints' / 'step_6'}", nproc=3)
    resumed = metrics_of(tmp_path / "resumed")
    assert [deterministic(r) for r in resumed] == [deterministic(r) for r in rows]


@pytest.mark.slow
def test_two_workers_give_the_samples_one_worker_gives(graft_train, metrics_of,
                                                       tmp_path: Path) -> None:
    steps = ["trainer.total_steps=4", "checkpoint.every_steps=0"]
    graft_train(tmp_path / "one", *RUN, *steps, *workers(1, 1), nproc=3)
    graft_train(tmp_path / "two", *RUN, *steps, *workers(2, 1), nproc=4)
    one, two = metrics_of(tmp_path / "one"), metrics_of(tmp_path / "two")
    # the same tokens; their rollout log-probs come from batches of other sizes, which may
    # round differently in the last bits (hence the correction's weights, the loss)
    for row, other in zip(one, two, strict=True):
        assert other["tokens"] == row["tokens"]
        for name in COMPARED:
            assert other[name] == pytest.approx(row[name], abs=1e-6), (row["step"], name)


@pytest.mark.vllm
def test_a_worker_generates_with_vllm(requires_vllm: None, graft_train, metrics_of,
                                      tmp_path: Path) -> None:
    graft_train(tmp_path / "run", *RUN, "trainer.total_steps=3", "checkpoint.every_steps=0",
                "rollout.engine=vllm", *workers(1, 1), nproc=3)
    rows = metrics_of(tmp_path / "run")
    assert [row["async_rl/staleness_max"] for row in rows] == [0.0, 1.0, 1.0]
    # the weights of steps 1 and 2 generate steps 3 and 4: only step 1's are sent
    assert [row["async_rl/weight_sync_gb"] > 0 for row in rows] == [True, False, False]


@pytest.mark.vllm
def test_on_policy_vllm_workers_sample_and_train_as_colocated_vllm(
        requires_vllm: None, graft_train, metrics_of, tmp_path: Path) -> None:
    steps = ["trainer.total_steps=2", "checkpoint.every_steps=0", "rollout.engine=vllm",
             "algorithm.rollout_correction=tis"]
    graft_train(tmp_path / "colocated", *RUN, *steps)
    graft_train(tmp_path / "workers", *RUN, *steps, *workers(1, 0), nproc=2)
    colocated, separate = metrics_of(tmp_path / "colocated"), metrics_of(tmp_path / "workers")
    for row, other in zip(colocated, separate, strict=True):
        assert other["tokens"] == row["tokens"]  # the same samples, from the same seeds
        for name in COMPARED:
            assert other[name] == pytest.approx(row[name], abs=1e-6), (row["step"], name)


@pytest.mark.vllm
def test_two_vllm_workers_four_updates_ahead_stay_within_the_bound(
        requires_vllm: None, graft_train, metrics_of, tmp_path: Path) -> None:
    graft_train(tmp_path / "run", *RUN, "trainer.total_steps=6", "checkpoint.every_steps=0",
                "rollout.engine=vllm", *workers(2, 4), nproc=4)
    rows = metrics_of(tmp_path / "run")
    assert [row["async_rl/staleness_max"] for row in rows] == [0.0, 1.0, 2.0, 3.0, 4.0, 4.0]
    assert all("rollout_correction/weight_mean" in row for row in rows)


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_workers_learn_as_colocated_vllm_one_and_four_updates_ahead(
        requires_vllm: None, graft_train, metrics_of, tmp_path: Path) -> None:
    steps = ["trainer.total_steps=12", "checkpoint.every_steps=0", "rollout.engine=vllm"]
    graft_train(tmp_path / "colocated", *RUN, *steps)
    graft_train(tmp_path / "k1", *RUN, *steps, *workers(1, 1), nproc=2)
    graft_train(tmp_path / "k4", *RUN, *steps, *workers(2, 4), nproc=3)
    expected = rise(metrics_of(tmp_path / "colocated"))
    for run in ("k1", "k4"):
        assert abs(rise(metrics_of(tmp_path / run)) - expected) <= 0.1, run


def rise(history: list[dict]) -> float:
    """The mean reward of the last 5 steps minus that of the first 5."""
    rewards = [row["reward_mean"] for row in history]
    return sum(rewards[-5:]) / 5 - sum(rewards[:5]) / 5


def _rank_pids(rank: int) -> list[int]:
    """The processes torchrun started as global rank ``rank`` (their environment says so)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ and b"graft" in command and b"train" in command:
            found.append(int(entry.name))
    return found


@pytest.mark.slow
def test_a_killed_worker_stops_the_run_naming_it_and_the_last_checkpoint_verifies(
        tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    run = tmp_path / "run"
    command = [sys.executable, "-m", "graft", "train", "--nproc", "3", f"trainer.run_dir={run}",
               *RUN, "trainer.total_steps=400", "checkpoint.every_steps=2", *workers(1, 1),
               "features.async_rl.worker_timeout_s=60"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAFT_")}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not (run / "checkpoints" / "latest").exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert (run / "checkpoints" / "latest").exists(), "no checkpoint within 240 s"
        for pid in _rank_pids(2):
            os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        _, stderr = process.communicate(timeout=120)
        assert time.monotonic() - killed < 60
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode != 0
    assert "rank 2 failed" in stderr, stderr[-2000:]
    verified = subprocess.run([sys.executable, "-m", "graft", "ckpt", "verify",
                               str(run / "checkpoints" / (run / "checkpoints" / "latest")
                                   .read_text().strip())], capture_output=True, text=True, env=env)
    assert verified.returncode == 0 and verified.stdout.startswith("ok"), verified.stdout


@pytest.mark.slow
def test_workers_load_a_saved_model_and_a_rerun_of_a_finished_run_trains_nothing(
        graft_train, metrics_of, tmp_path: Path) -> None:
    """``model.path`` (every rank of a role reads the directory itself) with workers, against
    the preset it was saved from; then the same command again: the run is complete."""
    from graft.testing.checkpoint import save_tiny_checkpoint

    folder = save_tiny_checkpoint("tiny-llama", tmp_path / "hf", seed=0)
    steps = ["trainer.total_steps=3", "checkpoint.every_steps=0", "checkpoint.save_at_end=true"]
    loaded = [*RUN, *steps, *workers(1, 1), f"model.path={folder}"]
    graft_train(tmp_path / "path", *loaded, nproc=3)
    graft_train(tmp_path / "preset", *RUN, *steps, *workers(1, 1), "model.preset=tiny-llama",
                nproc=3)
    from_path, from_preset = metrics_of(tmp_path / "path"), metrics_of(tmp_path / "preset")
    for row, other in zip(from_preset, from_path, strict=True):
        for name in COMPARED:
            assert other[name] == pytest.approx(row[name], abs=1e-6), (row["step"], name)
    rerun = graft_train(tmp_path / "path", *loaded, nproc=3)
    assert "is complete" in rerun.stdout + rerun.stderr
    assert metrics_of(tmp_path / "path") == from_path  # each step once
