"""bench/async_sim.py, the async-RL pipeline event model (issue 38, item 6), and
bench/async_sim_inputs.py, its inputs and checks: hand-computed cases, the staleness bound, idle
shares, processes sharing CPU cores (a waiting one uses none), the CPU runs' per-rank CPU
accounting, verl's published ratio within 20%, the ``--measured`` path over rounds, and the CLI."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
_spec = importlib.util.spec_from_file_location("async_sim", BENCH / "async_sim.py")
sim = importlib.util.module_from_spec(_spec)
sys.modules["async_sim"] = sim
_spec.loader.exec_module(sim)
_spec = importlib.util.spec_from_file_location("async_sim_inputs", BENCH / "async_sim_inputs.py")
sim_inputs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sim_inputs)  # imports async_sim: the module above

STEP, LENGTH, GROUP, PROMPTS = 0.01, 100, 4, 8  # decode step s, tokens, samples per prompt, prompts


def constant(**kw) -> sim.Setup:
    """Every response LENGTH tokens, a flat decode step, 1 engine per GPU holding the whole batch."""
    base = dict(decode_table=[[1, STEP], [256, STEP]], lengths=[LENGTH],
                update_tokens_per_s_per_gpu=[[1, 1000.0]], weight_gb=1.0, prompts_per_step=PROMPTS,
                group_size=GROUP, max_seqs_per_engine=PROMPTS * GROUP, sync_colocated_gb_per_s=10.0,
                sync_intra_node_gb_per_s=4.0, sync_latency_s=0.05)
    base.update(kw)
    return sim.Setup(**base)


def test_interp_is_linear_flat_below_and_extrapolated_above():
    t = [[8, 1.0], [16, 2.0]]
    assert sim.interp(t, 4) == 1.0 and sim.interp(t, 12) == 1.5 and sim.interp(t, 24) == 3.0


def test_colocated_step_is_gen_plus_train_plus_sync():
    s = constant(step_overhead_s=0.1)
    m = sim.simulate(s, sim.preset("colocated", 2))
    gen = LENGTH * STEP  # both engines decode in parallel
    train = PROMPTS * GROUP * LENGTH / (1000.0 * 2)
    sync = 1.0 / 10.0 + 0.05
    assert m["step_time_s"] == pytest.approx(gen + train + sync + 0.1)
    assert m["trainer_idle_share"] == pytest.approx(gen / m["step_time_s"])
    # constant lengths: the engines decode exactly while the trainer waits, so the shares sum to 1
    assert m["trainer_idle_share"] + m["rollout_idle_share"] == pytest.approx(1.0)


@pytest.mark.parametrize("rate", [200.0, 2000.0])  # trainer-bound and rollout-bound
def test_one_step_off_step_is_max_of_gen_and_train_plus_sync(rate):
    s = constant(update_tokens_per_s_per_gpu=[[1, rate]])
    m = sim.simulate(s, sim.preset("one_step_off", 2, rollout_gpus=1, recompute=False), steps=4, warmup=3)
    gen = LENGTH * STEP
    train_sync = PROMPTS * GROUP * LENGTH / rate + 1.0 / 4.0 + 0.05
    assert m["step_time_s"] == pytest.approx(max(gen, train_sync))
    assert m["staleness_max"] == 1
    assert m["trainer_idle_share"] == pytest.approx(1 - train_sync / max(gen, train_sync))
    assert m["rollout_idle_share"] == pytest.approx(1 - gen / max(gen, train_sync))


def test_old_logprob_recompute_scales_the_update():
    s = constant(update_tokens_per_s_per_gpu=[[1, 200.0]], logprob_pass_fraction=0.5)
    on = sim.simulate(s, sim.preset("one_step_off", 2, 1, recompute=True), steps=3, warmup=3)
    train = PROMPTS * GROUP * LENGTH / 200.0
    assert on["step_time_s"] == pytest.approx(1.5 * train + 1.0 / 4.0 + 0.05)


@pytest.mark.parametrize("k", [0, 1, 2, 4])
@pytest.mark.parametrize("order", ["prompt", "completion"])
def test_staleness_never_exceeds_k(k, order):
    lengths = [5, 10, 20, 40, 80, 400]  # a heavy tail
    s = constant(lengths=lengths, max_seqs_per_engine=GROUP * 2, continuous=True,
                 update_tokens_per_s_per_gpu=[[1, 5000.0]])
    pipe = sim.Pipeline("fully_async", 4, 2, max_staleness=k, partial=True, order=order,
                        buffer_batches=k + 2)
    m = sim.simulate(s, pipe, steps=6, warmup=2, seed=3)
    assert m["staleness_max"] <= k
    assert 0.0 <= m["trainer_idle_share"] <= 1.0 and 0.0 <= m["rollout_idle_share"] <= 1.0


def test_the_tail_costs_colocated_more_than_fully_async():
    """Same mean length, one long response in 8: the colocated step waits for it, async overlaps."""
    tail = constant(lengths=[50] * 7 + [450], max_seqs_per_engine=GROUP * 4, continuous=True)
    colo = sim.simulate(tail, sim.preset("colocated", 2))
    asyn = sim.simulate(tail, sim.preset("fully_async", 2, 1, k=2, recompute=False), steps=6, warmup=3)
    assert asyn["step_time_s"] < colo["step_time_s"]


@pytest.mark.parametrize("cores", [0, 1, 2])
def test_processes_sharing_cores_run_at_cores_over_busy(cores):
    """One engine and one trainer: on their own devices (0) or 2 cores the step is max(gen, train);
    on 1 core each runs at half speed while both are busy, so the step is gen + train (all the work)."""
    s = constant(update_tokens_per_s_per_gpu=[[1, 3200.0]], cpu_cores=cores)
    m = sim.simulate(s, sim.preset("one_step_off", 2, 1, recompute=False), steps=3, warmup=3)
    gen, train_sync = LENGTH * STEP, PROMPTS * GROUP * LENGTH / 3200.0 + 1.0 / 4.0 + 0.05
    step = gen + train_sync if cores == 1 else max(gen, train_sync)
    assert m["step_time_s"] == pytest.approx(step)
    assert m["trainer_idle_share"] == pytest.approx(0.0, abs=1e-9)


def test_a_waiting_process_uses_no_core():
    """k = 0, one worker and two trainers on 2 cores: they never run at once, so each runs at full
    speed and the step is gen + train + sync (a waiting rank is not counted as busy)."""
    s = constant(update_tokens_per_s_per_gpu=[[2, 3200.0]], cpu_cores=2)
    m = sim.simulate(s, sim.preset("fully_async", 3, 1, k=0, partial=False, recompute=False),
                     steps=3, warmup=3)
    train = PROMPTS * GROUP * LENGTH / (3200.0 * 2)
    assert m["step_time_s"] == pytest.approx(LENGTH * STEP + train + 1.0 / 4.0 + 0.05)


def test_cpu_window_splits_the_machine_into_ranks_and_other_work(tmp_path):
    marks = [{"t": 0.0, "steps": 1, "ranks": {"0": 1.0, "1": 1.0}, "launcher": 0.5, "machine": 10.0},
             {"t": 1.0, "steps": 2, "ranks": {"0": 1.5, "1": 1.4}, "launcher": 0.6, "machine": 11.5},
             {"t": 3.0, "steps": 4, "ranks": {"0": 2.5, "1": 2.2}, "launcher": 0.7, "machine": 13.9}]
    (tmp_path / "cpu.json").write_text(json.dumps({"command": "graft train", "marks": marks}))
    w = sim_inputs.cpu_window(tmp_path, 3, 4)  # from the end of step 2 to the end of step 4
    assert w["wall_s"] == pytest.approx(2.0)
    assert w["rank_cores"] == pytest.approx({"0": 0.5, "1": 0.4})
    assert w["other_cores"] == pytest.approx((2.4 - 1.8 - 0.1) / 2.0)


def test_verl_published_ratio_within_20_percent():
    res = sim_inputs.check_verl()
    assert abs(res["predicted_ratio"] / 2.35 - 1) < 0.20
    assert res["colocated"]["step_time_s"] == pytest.approx(356.30, rel=0.05)


def test_measured_path_reports_the_error(tmp_path):
    inputs = {k: v for k, v in vars(constant()).items() if k != "extra"}
    (tmp_path / "inputs.json").write_text(json.dumps(inputs))
    rows = [{"step": i, "step_time_s": 2.0 if i == 1 else t, "rollout_s": 1.0, "update_s": 0.5}
            for i, t in enumerate([9, 1.5, 1.6, 1.4], start=1)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    spec = {"inputs": "inputs.json", "gpus": 2,
            "modes": {"colocated": {"metrics": "metrics.jsonl"},
                      "k1": {"kind": "one_step_off", "rollout_gpus": 1, "step_time_s": 1.0}}}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert sim_inputs.measured_step_times(spec, tmp_path)["colocated"] == pytest.approx([1.5])
    for i, shift in enumerate((0.0, 0.3)):  # rounds, named by a glob: their means are averaged
        (tmp_path / f"r{i}").mkdir()
        (tmp_path / f"r{i}" / "metrics.jsonl").write_text("\n".join(
            json.dumps({**r, "step_time_s": r["step_time_s"] + shift}) for r in rows) + "\n")
    rounds = sim_inputs.measured_step_times({"modes": {"c": {"metrics": "r*/metrics.jsonl"}}}, tmp_path)
    assert rounds["c"] == pytest.approx([1.5, 1.8])
    res = sim_inputs.compare_measured(spec, tmp_path)
    expect = LENGTH * STEP + PROMPTS * GROUP * LENGTH / 2000.0 + 0.15
    assert res["colocated"]["predicted_step_time_s"] == pytest.approx(expect)
    assert res["colocated"]["error"] == pytest.approx(expect / 1.5 - 1)
    spec["record"] = {"measures": "the check", "headline": "{modes.colocated.error:+.1%}"}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    cmd = [sys.executable, str(BENCH / "async_sim.py"), "--measured", str(tmp_path / "spec.json"),
           "--out", str(tmp_path / "check.json")]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert "colocated: predicted" in out and "k1: predicted" in out
    check = json.loads((tmp_path / "check.json").read_text())  # a bench/README row: record, command
    assert check["measures"] == "the check"
    assert check["command"].startswith("python3 bench/async_sim.py --measured")
    assert check["modes"]["colocated"]["error"] == pytest.approx(expect / 1.5 - 1)


def test_cli_runs_on_the_committed_inputs(tmp_path):
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, str(BENCH / "async_sim.py"), "--gpus", "8", "--out", str(out)],
                          capture_output=True, text=True, check=True)
    assert "fully_async" in proc.stdout
    res = json.loads(out.read_text())["inputs_1p1b/8"]
    assert set(res) == set(sim.PIPELINES) and res["colocated"]["staleness_max"] == 0
