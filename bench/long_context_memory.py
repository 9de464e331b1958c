"""Memory accounting of `long_context.py`: per-phase peaks of a backward and the lines through
measured peaks that extrapolate the largest length (GPU and host)."""

from __future__ import annotations

import torch


class PhasePeaks:
    """Peak GPU memory (GiB) of a step and of each phase of its backward: from its start to
    the first block's output gradient (the head, the final norm), then from each block's output
    gradient to the next one's (that block's recompute and backward). Enter it before the
    forward (its hooks go on the blocks' outputs), call `backward_starts` before the backward."""

    def __init__(self, blocks: list[torch.nn.Module], cuda: bool) -> None:
        self.blocks, self.cuda = blocks, cuda
        self.peaks: list[tuple[str, float]] = []
        self.overall_gib = 0.0
        self._phase = "forward"
        self._handles: list = []

    def _close_phase(self, name: str) -> None:
        peak = torch.cuda.max_memory_allocated() / 2**30
        self.overall_gib = max(self.overall_gib, peak)
        if self._phase != "forward":
            self.peaks.append((self._phase, round(peak, 3)))
        torch.cuda.reset_peak_memory_stats()
        self._phase = name

    def backward_starts(self) -> None:
        """The forward is done: the next phase is the head's backward."""
        if self.cuda:
            torch.cuda.synchronize()
            self._close_phase("head")

    def __enter__(self) -> PhasePeaks:
        if not self.cuda:
            return self

        def on_output(output: object, index: int) -> None:
            if isinstance(output, torch.Tensor) and output.requires_grad:
                output.register_hook(lambda grad: self._close_phase(f"block {index}"))

        self._handles = [b.register_forward_hook(lambda m, a, o, i=i: on_output(o, i))
                         for i, b in enumerate(self.blocks)]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        if self.cuda:
            torch.cuda.synchronize()
            self._close_phase("done")


def line(points: list[tuple[int, float]], capacity_gib: float) -> tuple[float, float, int | None]:
    """Least-squares ``gib = fixed + slope * tokens``: (slope, fixed, the largest length, a
    multiple of 1024, it leaves under ``capacity_gib``; None when it does not grow)."""
    n = len(points)
    mean_t, mean_p = sum(t for t, _ in points) / n, sum(p for _, p in points) / n
    slope = (sum((t - mean_t) * (p - mean_p) for t, p in points)
             / sum((t - mean_t) ** 2 for t, _ in points))
    fixed = mean_p - slope * mean_t
    largest = int((capacity_gib - fixed) / slope) // 1024 * 1024 if slope > 1e-12 else None
    return slope, fixed, largest


def fit_line(rows: list[dict], variant: str, capacity_gib: float,
             host_limit_gib: float) -> dict | None:
    """Lines through ``variant``'s peak GPU memory and (offloaded) host memory, and the largest
    length both leave under ``capacity_gib`` and ``host_limit_gib``."""
    ok = [r for r in rows if r["variant"] == variant and r["status"] == "ok"
          and r.get("peak_gib") is not None]
    if len(ok) < 2:
        return None
    slope, fixed, largest = line([(r["tokens"], r["peak_gib"]) for r in ok], capacity_gib)
    fit = {"variant": variant, "gib_per_1k_tokens": round(slope * 1024, 4),
           "fixed_gib": round(fixed, 2), "from_lengths": sorted(r["tokens"] for r in ok)}
    # The step's peak is the largest of its phases' (the head's, the blocks'); where a phase
    # that is not the peak at the measured lengths grows faster, it is the peak further on.
    if all("backward_peaks_gib" in r for r in ok):
        for phase in ("head", "blocks_max"):
            p_slope, p_fixed, p_largest = line(
                [(r["tokens"], r["backward_peaks_gib"][phase]) for r in ok], capacity_gib)
            fit[f"{phase}_gib_per_1k_tokens"] = round(p_slope * 1024, 4)
            fit[f"{phase}_fixed_gib"] = round(p_fixed, 2)
            if p_largest is not None and (largest is None or p_largest < largest):
                largest = p_largest
    fit["largest_tokens_gpu"] = largest
    if all("host_gib" in r for r in ok):
        host_slope, host_fixed, host_largest = line([(r["tokens"], r["host_gib"]) for r in ok],
                                                    host_limit_gib)
        fit.update(host_gib_per_1k_tokens=round(host_slope * 1024, 4),
                   host_fixed_gib=round(host_fixed, 2), largest_tokens_host=host_largest,
                   host_limit_gib=round(host_limit_gib, 1))
        if host_largest is not None and largest is not None:
            largest = min(largest, host_largest)
    fit["largest_tokens_extrapolated"] = largest
    return fit
