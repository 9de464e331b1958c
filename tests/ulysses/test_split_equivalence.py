"""Rows split by sequence over 2 ranks (sp=2), over 2 x 2 ranks (dp=2 x sp=2), and over 4 ranks
(sp=4: more ranks than the presets' 2 KV heads, which are then repeated), train exactly
as one rank does: the same reported loss and gradients (1e-6 relative, fp32) under every
built-in loss_agg_mode, the same log-probs per sample, for dense and MoE presets, with
activation checkpointing + chunked log-probs + pad_to_length, and with routing replay R2 (the
routes recorded under sp=2 equal sp=1's bit for bit and replay with no mismatch).

The rows are packed (several samples of 6 to 39 tokens each, uneven) and padded differently
at sp=1 and sp=2 (47 vs 48 tokens: the split pads to a multiple of sp), so a pad token reaching
the loss or the token counts would show as a difference. One launch per layout
(tests/ulysses/scripts/split_grads.py), every check reading its outputs.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from graft.losses import BUILTIN_AGG_MODES
from graft_router_replay.routes import ROUTES

# Every test here reads the 4-process runs of one fixture (~90 s), launched once per test run.
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parent / "scripts" / "split_grads.py"
VARIANTS = ("dense", "moe", "dense_ckpt_chunked", "moe_r2")
# name: (ranks, sp, variants)
LAYOUTS = {"sp1": (1, 1, VARIANTS), "sp2": (2, 2, VARIANTS), "dp2_sp2": (4, 2, VARIANTS),
           "sp4": (4, 4, ("dense", "moe"))}


def launch(out: Path, ranks: int, sp: int, variants: tuple[str, ...]) -> Path:
    out.mkdir(parents=True)
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={ranks}"]
    command = [*(launcher if ranks > 1 else [sys.executable]), str(SCRIPT), str(out), str(sp),
               ",".join(variants)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{ranks} ranks, sp={sp}:\n{result.stderr[-4000:]}"
    return out


def launch_every_layout(root: Path) -> None:
    for name, layout in LAYOUTS.items():
        launch(root / name, *layout)


@pytest.fixture(scope="module")
def results(build_once) -> dict[str, dict[str, dict]]:
    root = build_once("ulysses-split", launch_every_layout)
    return {name: {v: torch.load(root / name / f"{v}.pt") for v in variants}
            for name, (_, _, variants) in LAYOUTS.items()}


def assert_close(reference: torch.Tensor, other: torch.Tensor, what: str) -> None:
    scale = max(1.0, float(reference.abs().max()))
    assert torch.allclose(reference, other, rtol=1e-6, atol=1e-6 * scale), (
        f"{what}: max diff {(reference - other).abs().max():.3g}")


def per_sample(result: dict, key: str) -> dict[int, torch.Tensor]:
    """Sample index -> its tensor, from every rank's share (the sp ranks hold the same)."""
    ranks = result.get("per_rank") or [result]
    return {index: value for rank in ranks
            for index, value in zip(rank["samples"], rank[key], strict=True)}


@pytest.mark.parametrize(("layout", "variant"), [
    *((layout, variant) for layout in ("sp2", "dp2_sp2") for variant in VARIANTS),
    ("sp4", "dense"), ("sp4", "moe")])
def test_split_rows_give_the_loss_and_gradients_of_one_rank(results, layout: str,
                                                            variant: str) -> None:
    one, split = results["sp1"][variant], results[layout][variant]
    for mode in BUILTIN_AGG_MODES:
        loss = torch.tensor(one[mode]["loss"], dtype=torch.float64)
        assert_close(loss, torch.tensor(split[mode]["loss"], dtype=torch.float64),
                     f"{variant} {mode} loss")
        for name, grad in one[mode]["grads"].items():
            assert_close(grad, split[mode]["grads"][name], f"{variant} {mode} {name}")
    grads = [one[mode]["grads"]["lm_head.weight"] for mode in BUILTIN_AGG_MODES]
    assert all(not torch.allclose(a, b) for i, a in enumerate(grads) for b in grads[i + 1:])


@pytest.mark.parametrize("layout", ["sp2", "dp2_sp2", "sp4"])
def test_split_rows_give_every_samples_log_probs(results, layout: str) -> None:
    for variant in results[layout]:
        one = per_sample(results["sp1"][variant], "logprobs")
        split = per_sample(results[layout][variant], "logprobs")
        assert one.keys() == split.keys() == set(range(12))
        for index, values in one.items():
            assert values.shape == split[index].shape
            assert_close(values, split[index], f"{variant} sample {index} log-probs")


def test_split_rows_are_padded_to_a_multiple_of_sp(results) -> None:
    assert results["sp1"]["dense"]["row_lengths"] == [47]
    assert results["sp2"]["dense"]["row_lengths"] == [48]
    assert results["sp2"]["dense_ckpt_chunked"]["row_lengths"] == [50]  # lcm(bucket 5, sp 2)
    assert results["sp4"]["dense"]["row_lengths"] == [48]


@pytest.mark.parametrize("layout", ["sp2", "dp2_sp2"])
def test_r2_routes_recorded_on_split_rows_equal_one_ranks_and_replay_exactly(results,
                                                                             layout: str) -> None:
    one = per_sample(results["sp1"]["moe_r2"], ROUTES)
    split = per_sample(results[layout]["moe_r2"], ROUTES)
    assert one.keys() == split.keys()
    for index, routes in one.items():
        assert routes.dtype == torch.int16 and torch.equal(routes, split[index]), index
    metrics = results[layout]["moe_r2"]["replay_metrics"]
    assert metrics["router_replay/mismatch_fraction"] == 0.0
    assert metrics["ulysses/all_to_all_gb"] > 0
