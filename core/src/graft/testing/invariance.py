"""Split invariance: a loss's gradient for one mini-batch must not depend on how the mini-batch
is split over data-parallel ranks and micro-batches (what every ``loss_agg_mode`` promises).

The core checks its own losses with these pieces and a loss plugin checks its loss the same way:

* a script, run once on one rank with four micro-batches and once under torchrun on two ranks
  with one each: `fixed_token_samples` (the mini-batch), `rank_groups` (this rank's samples per
  micro-batch), then `save_gradients_per_mode` (rank 0 saves the full gradient per mode);
* the test: `gradients_of_splits` runs the script both ways, `assert_same_gradients` compares
  one mode's gradients, `assert_modes_differ` that the modes are not all the same loss.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from graft.engine.batch.micro_batch import TokenSample
from graft.losses.contract import BUILTIN_AGG_MODES


def fixed_token_samples(count: int = 16, *, seed: int = 7) -> list[TokenSample]:
    """``count`` samples of 6 to 39 token ids (3..99) with a random prompt/response split, drawn
    from ``seed``; sample 5 has no response token at all (it must not count as a sequence)."""
    generator = torch.Generator().manual_seed(seed)
    samples = []
    for index in range(count):
        length = int(torch.randint(6, 40, (1,), generator=generator))
        ids = torch.randint(3, 100, (length,), generator=generator).tolist()
        start = length if index == 5 else int(torch.randint(1, length - 1, (1,),
                                                            generator=generator))
        samples.append(TokenSample(ids, response_start=start))
    return samples


def rank_groups(count: int, *, rank: int, world_size: int,
                micro_batches: int) -> list[list[int]]:
    """Indices into a mini-batch of ``count`` samples for each of this rank's micro-batches:
    rank r takes samples r, r + world_size, ..., dealt round-robin into ``micro_batches``."""
    local = list(range(count))[rank::world_size]
    return [local[i::micro_batches] for i in range(micro_batches)]


def save_gradients_per_mode(engine: Any, batches: list[Any], loss_fn: Callable[..., Any],
                            cfg: Any, out_dir: str | Path, *, is_main: bool,
                            modes: Sequence[str] = BUILTIN_AGG_MODES,
                            loss_scale_factor: float = 7.0) -> None:
    """For each of ``modes``: set ``cfg.loss.loss_agg_mode``, run ``engine.forward_backward``
    over ``batches`` with ``loss_fn``, and on the main rank save every parameter's full
    (unsharded) gradient to ``out_dir/<mode>.pt``. Every rank must call it (gathers are
    collective)."""
    for mode in modes:
        cfg.loss.loss_agg_mode = mode
        engine.forward_backward(batches, loss_fn, loss_scale_factor=loss_scale_factor)
        grads = {name: p.grad.full_tensor() for name, p in engine.model.named_parameters()}
        engine.optimizer.zero_grad(set_to_none=True)
        if is_main:
            torch.save(grads, Path(out_dir) / f"{mode}.pt")


def _run_script(script: Path, out: Path, *, ranks: int, micro_batches: int,
                timeout_s: float) -> None:
    out.mkdir(parents=True)
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={ranks}"]
    command = [*(launcher if ranks > 1 else [sys.executable]), str(script), str(out),
               str(micro_batches)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    if result.returncode != 0:
        raise AssertionError(f"{script.name} on {ranks} rank(s) failed:\n{result.stderr[-3000:]}")


def gradients_of_splits(script: str | Path, root: str | Path, *,
                        timeout_s: float = 300) -> tuple[Path, Path]:
    """Run ``script OUT_DIR MICRO_BATCHES`` on one rank with 4 micro-batches and under torchrun
    on 2 ranks with 1 each; the two output folders ``(one_rank, two_ranks)`` under ``root``."""
    one, two = Path(root) / "one_rank", Path(root) / "two_ranks"
    _run_script(Path(script), one, ranks=1, micro_batches=4, timeout_s=timeout_s)
    _run_script(Path(script), two, ranks=2, micro_batches=1, timeout_s=timeout_s)
    return one, two


def assert_same_gradients(one_rank: Path, two_ranks: Path, mode: str) -> None:
    """The two splits' gradients under ``mode`` agree to 1e-6 relative to each tensor's scale
    (fp32 summation order alone moves sums over a few hundred tokens by that much), and are
    not all (near) zero."""
    one = torch.load(Path(one_rank) / f"{mode}.pt")
    two = torch.load(Path(two_ranks) / f"{mode}.pt")
    assert one.keys() == two.keys(), sorted(set(one) ^ set(two))
    for name in one:
        scale = max(1.0, float(two[name].abs().max()))
        assert torch.allclose(one[name], two[name], rtol=1e-6, atol=1e-6 * scale), (
            f"{mode} {name}: max diff {(one[name] - two[name]).abs().max():.3g}")
    assert any(g.abs().max() > 1e-4 for g in one.values()), f"{mode}: the gradient is zero"


def assert_modes_differ(folder: Path, parameter: str,
                        modes: Sequence[str] = BUILTIN_AGG_MODES) -> None:
    """No two of ``modes`` give the same gradient for ``parameter`` (each mode is a different
    normalisation, so a loss that ignored the mode would pass the invariance trivially)."""
    grads = {mode: torch.load(Path(folder) / f"{mode}.pt")[parameter] for mode in modes}
    for i, a in enumerate(modes):
        for b in modes[i + 1:]:
            assert not torch.allclose(grads[a], grads[b]), f"{a} and {b} give the same gradient"
