#!/usr/bin/env python3
"""Event model of three RL pipelines over G GPUs (issue 38, item 6): colocated, one-step-off, fully async.

What: a discrete-event simulation, stdlib only. Rollout engines (``gpus_per_engine`` GPUs each) decode
sequences; one decode step of an engine takes ``decode_table(live sequences)`` seconds (interpolated), so
a rollout's time is the sum over its decode steps of the still-running batch's step time and the tail of
the response lengths matters. The trainer updates at ``update_tokens_per_s_per_gpu`` (a table by trainer
GPUs), then syncs weights (``GB / GB/s + latency``). All three pipelines run on the same machinery:

* colocated: every GPU generates (``max_staleness=0``), then trains, then syncs;
* one-step-off: R GPUs generate batch t+1 while G-R train batch t (``max_staleness=1``);
* fully async: workers generate continuously into a bounded buffer; the trainer takes a batch whose
  samples are at most k versions old (``order=prompt``: batch t is prompts [tP, (t+1)P) and a prompt of
  batch t starts only at version >= t-k; ``order=completion``: the first groups finished, older ones
  dropped and counted). ``partial``: in-flight sequences go on with new weights at a sync; otherwise an
  engine drains before it loads them. A sample's version is that of its first token.

When: before building or sizing an async run; ``--check-verl`` checks the model against verl's published
fully-async result, ``--measured`` against a measured run. Units: seconds, tokens, GB (1e9 bytes).
Inputs: a JSON file whose keys are the fields of ``Setup`` (plus free-form ``source`` / ``notes``);
``async_sim_inputs.py`` builds them, verl's setup and the measured comparisons (this CLI calls it).
"""
from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import statistics
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "async_sim"
PIPELINES = ("colocated", "one_step_off", "fully_async")


@dataclass
class Setup:
    """Measured inputs (JSON keys = field names). Tables are lists of [x, y] pairs, linearly interpolated."""

    decode_table: list  # [[live sequences in one engine, seconds per decode step]]
    lengths: list  # response lengths in tokens (empirical list, sampled with replacement)
    update_tokens_per_s_per_gpu: list  # [[trainer GPUs, trained tokens/s per GPU]]
    weight_gb: float  # bytes sent per weight sync, GB
    prompts_per_step: int  # prompts (groups) per trainer step
    group_size: int = 1  # samples per prompt; a group is admitted and delivered whole
    prompt_tokens: float = 0.0  # mean prompt length (trained, not decoded: prefill is not modelled)
    gpus_per_engine: int = 1
    max_seqs_per_engine: int = 256  # concurrent sequences (rounded down to whole groups)
    continuous: bool = False  # True: admit groups as slots free (vLLM); False: static batches
    logprob_pass_fraction: float = 0.0  # old-log-prob forward time / update time
    step_overhead_s: float = 0.0  # per trainer step (reward, bookkeeping), on the trainer
    sync_colocated_gb_per_s: float = 1e9
    sync_intra_node_gb_per_s: float = 1e9
    sync_inter_node_gb_per_s: float = 1e9
    sync_latency_s: float = 0.0
    gpus_per_node: int = 8
    cpu_cores: float = 0.0  # >0: the processes share these cores: each busy one (generating, or a trainer
    # updating or syncing) runs at min(1, cores / busy); one waiting for data or weights uses none
    extra: dict = field(default_factory=dict)  # source, notes: ignored by the model

    @classmethod
    def from_json(cls, data: dict) -> Setup:
        """Build from a parsed inputs file; unknown keys go to ``extra``."""
        names = {f.name for f in fields(cls)} - {"extra"}
        return cls(**{k: v for k, v in data.items() if k in names},
                   extra={k: v for k, v in data.items() if k not in names})


@dataclass
class Pipeline:
    """One pipeline's shape. ``rollout_gpus`` is R (0: colocated, all GPUs do both)."""

    kind: str
    gpus: int
    rollout_gpus: int = 0
    max_staleness: int | None = 0  # k; None: unbounded (no drops)
    partial: bool = False
    order: str = "prompt"  # prompt | completion
    buffer_batches: float = 2.0  # started-but-not-trained groups allowed, in batches
    cap_mode: str = "buffer"  # buffer | per_version (verl: budget reset at each sync)
    train_chunks: int = 1  # local updates per version (trainer streams chunks)
    recompute_old_logprobs: bool = False


def interp(table: list, x: float) -> float:
    """Piecewise-linear y(x) through sorted [x, y] pairs; flat below, linear beyond the last pair."""
    pts = sorted((float(a), float(b)) for a, b in table)
    if len(pts) == 1 or x <= pts[0][0]:
        return pts[0][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:], strict=False):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = pts[-2], pts[-1]
    return y1 + (y1 - y0) * (x - x1) / (x1 - x0)


def sync_seconds(setup: Setup, pipe: Pipeline) -> float:
    """Weight-sync time in seconds: GB / GB/s + latency (colocated, one node, or across nodes)."""
    if pipe.rollout_gpus == 0:
        rate = setup.sync_colocated_gb_per_s
    elif pipe.gpus <= setup.gpus_per_node:
        rate = setup.sync_intra_node_gb_per_s
    else:
        rate = setup.sync_inter_node_gb_per_s
    return setup.weight_gb / rate + setup.sync_latency_s


class _Engine:
    __slots__ = ("live", "progress", "t", "busy", "version", "pending", "stamp", "groups", "t_start")

    def __init__(self) -> None:
        self.live: list = []  # heap of (finish progress, group id)
        self.progress = 0.0  # decode steps run since start
        self.t = self.busy = 0.0
        self.version, self.pending, self.stamp, self.groups, self.t_start = 0, None, 0, {}, -1.0


class Simulation:
    """One pipeline over ``warmup + steps`` trainer steps; ``run()`` returns its metrics."""

    def __init__(self, setup: Setup, pipe: Pipeline, steps: int = 4, warmup: int = 2, seed: int = 0):
        self.s, self.p, self.steps, self.warmup, self.seed = setup, pipe, steps, warmup, seed
        rollout = pipe.rollout_gpus or pipe.gpus
        self.train_gpus = pipe.gpus - pipe.rollout_gpus
        self.engines = [_Engine() for _ in range(max(1, rollout // setup.gpus_per_engine))]
        self.max_groups = max(1, setup.max_seqs_per_engine // setup.group_size)
        self.P, self.sync_s = setup.prompts_per_step, sync_seconds(setup, pipe)
        self.cap = max(1, round(pipe.buffer_batches * self.P))
        self.events: list = []
        self.n_events = self.next_gid = self.version = self.outstanding = self.drops = 0
        self.budget = self.cap
        self.start_v: dict = {}
        # finished, untrained groups: gid -> start version (insertion = completion order)
        self.done: dict = {}
        self.lengths: dict = {}
        self.step = self.chunk = 0
        self.trainer_busy = False
        self.t_busy = self.t_left = self.t_at = self.t_began = 0.0  # trainer busy s; work left at full speed
        self.t_stamp, self.speed = 0, 1.0  # speed: of each busy process (below 1 only with cpu_cores)
        self.snap: dict = {}  # version -> (time, trainer busy s, engines busy s)
        self.stale: list = []
        self.tokens = 0.0
        self.rate = interp(setup.update_tokens_per_s_per_gpu, self.train_gpus) * self.train_gpus

    def _group_lengths(self, gid: int) -> list:
        rng = random.Random(self.seed * 1_000_003 + gid)
        return [rng.choice(self.s.lengths) for _ in range(self.s.group_size)]

    def _push(self, t: float, kind: str, idx: int = 0, stamp: int = 0) -> None:
        self.n_events += 1
        heapq.heappush(self.events, (t, self.n_events, kind, idx, stamp))

    def _step_s(self, live: int) -> float:
        return interp(self.s.decode_table, live) / self.speed

    def _advance_trainer(self, now: float) -> None:
        if self.trainer_busy:
            self.t_left -= (now - self.t_at) * self.speed
        self.t_at = now

    def _push_trained(self) -> None:
        self.t_stamp += 1
        self._push(self.t_at + self.t_left / self.speed, "train", 0, self.t_stamp)

    def _resync(self, now: float) -> None:
        """With ``cpu_cores``: when the count of busy processes changed, advance all work at the old
        speed and reschedule it at the new one (processor sharing: each runs at min(1, cores / busy))."""
        if not self.s.cpu_cores:
            return
        busy = (sum(self.s.gpus_per_engine for e in self.engines if e.live)
                + self.train_gpus * self.trainer_busy)
        speed = min(1.0, self.s.cpu_cores / max(busy, 1))
        if speed == self.speed:
            return
        for e in self.engines:
            self._advance(e, now)
        self._advance_trainer(now)
        self.speed = speed
        for i in range(len(self.engines)):
            self._reschedule(i)
        if self.trainer_busy:
            self._push_trained()

    def _advance(self, e: _Engine, now: float) -> None:
        if e.live:
            e.progress += (now - e.t) / self._step_s(len(e.live))
            e.busy += now - e.t
        e.t = now

    def _reschedule(self, i: int) -> None:
        e = self.engines[i]
        e.stamp += 1
        if e.live:
            self._push(e.t + (e.live[0][0] - e.progress) * self._step_s(len(e.live)), "eng", i, e.stamp)

    def _admissible(self, gid: int, version: int) -> bool:
        k = self.p.max_staleness
        if self.p.order == "prompt" and k is not None and gid // self.P - version > k:
            return False
        return self.budget > 0 if self.p.cap_mode == "per_version" else self.outstanding < self.cap

    def _fill(self, i: int, now: float, limit: int = 1 << 30) -> int:
        """Start up to ``limit`` admissible groups on engine i; returns how many started."""
        e = self.engines[i]
        if e.pending is not None:
            if e.live:
                return 0  # draining before loading the new weights
            e.version, e.pending = e.pending, None
        if e.live and not self.s.continuous and e.t_start != now:
            return 0  # a static batch only grows at the instant it starts
        started = 0
        while (started < limit and len(e.groups) < self.max_groups
               and self._admissible(self.next_gid, e.version)):
            if not started:
                self._advance(e, now)
                if not e.live:
                    e.t_start = now
            started += 1
            gid = self.next_gid
            self.next_gid += 1
            self.lengths[gid] = lens = self._group_lengths(gid)
            for n in lens:
                heapq.heappush(e.live, (e.progress + n, gid))
            e.groups[gid], self.start_v[gid] = len(lens), e.version
            self.outstanding += 1
            self.budget -= 1
        if started:
            self._reschedule(i)
        return started

    def _fill_all(self, now: float) -> None:
        """Spread admissible groups over the engines one at a time (round robin)."""
        while sum(self._fill(i, now, 1) for i in range(len(self.engines))):
            pass

    def _on_engine(self, i: int, now: float) -> None:
        e = self.engines[i]
        self._advance(e, now)
        while e.live and e.live[0][0] <= e.progress + 1e-9:
            _, gid = heapq.heappop(e.live)
            e.groups[gid] -= 1
            if not e.groups[gid]:
                del e.groups[gid]
                self.done[gid] = self.start_v.pop(gid)
        self._fill(i, now)
        self._reschedule(i)
        self._try_train(now)

    def _take(self, n: int) -> list | None:
        """Groups for the next chunk, or None while they are not ready."""
        k = self.p.max_staleness
        if self.p.order == "prompt":
            first = self.step * self.P + self.chunk * n
            want = range(first, first + n)
            return list(want) if all(g in self.done for g in want) else None
        if k is not None:
            for g in [g for g, v in self.done.items() if self.step - v > k]:
                del self.done[g]
                self.drops += 1
                self.outstanding -= 1
        return list(self.done)[:n] if len(self.done) >= n else None

    def _try_train(self, now: float) -> None:
        if self.trainer_busy or self.step >= self.warmup + self.steps:
            return
        n = math.ceil(self.P / self.p.train_chunks)
        n = min(n, self.P - self.chunk * n)
        gids = self._take(n)
        if gids is None:
            return
        tokens = 0.0
        for g in gids:
            v = self.done.pop(g)
            tokens += sum(self.lengths.pop(g)) + self.s.prompt_tokens * self.s.group_size
            if self.step >= self.warmup:
                self.stale.append(self.step - v)
        self.outstanding -= len(gids)
        if self.step >= self.warmup:
            self.tokens += tokens
        dur = tokens / self.rate * (1 + self.s.logprob_pass_fraction * self.p.recompute_old_logprobs)
        self.chunk += 1
        if self.chunk * n >= self.P:
            dur += self.s.step_overhead_s + self.sync_s
        self.trainer_busy, self.t_left, self.t_at, self.t_began = True, dur, now, now
        self._push_trained()
        self._fill_all(now)

    def _on_trained(self, now: float) -> None:
        self.trainer_busy, self.t_busy = False, self.t_busy + now - self.t_began
        if self.chunk * math.ceil(self.P / self.p.train_chunks) >= self.P:
            self.step, self.chunk = self.step + 1, 0
            self.version = self.step
            self.budget = self.cap - self.outstanding
            for i, e in enumerate(self.engines):
                if self.p.partial or not e.live:
                    e.version = self.version
                else:
                    e.pending = self.version
                self._advance(e, now)
                self._reschedule(i)
            self.snap[self.version] = (now, self.t_busy, sum(e.busy for e in self.engines))
            self._fill_all(now)
        self._try_train(now)

    def run(self) -> dict:
        """Simulate; metrics over steps ``warmup .. warmup+steps`` (seconds, shares in [0, 1])."""
        self.snap[0] = (0.0, 0.0, 0.0)
        self._fill_all(0.0)
        self._resync(0.0)
        while self.step < self.warmup + self.steps:
            now, _, kind, i, stamp = heapq.heappop(self.events)
            if stamp != (self.t_stamp if kind == "train" else self.engines[i].stamp):
                continue
            self._on_trained(now) if kind == "train" else self._on_engine(i, now)
            self._resync(now)
        (t0, tb0, eb0), (t1, tb1, eb1) = self.snap[self.warmup], self.snap[self.warmup + self.steps]
        wall = t1 - t0
        return {"step_time_s": wall / self.steps,
                "tokens_per_s_per_gpu": self.tokens / wall / self.p.gpus,
                "trainer_idle_share": max(0.0, 1 - (tb1 - tb0) / wall),
                "rollout_idle_share": max(0.0, 1 - (eb1 - eb0) / (wall * len(self.engines))),
                "staleness_mean": statistics.fmean(self.stale), "staleness_max": max(self.stale),
                "dropped_groups": self.drops, "rollout_gpus": self.p.rollout_gpus,
                "sync_s": self.sync_s}


def preset(kind: str, gpus: int, rollout_gpus: int = 0, k: int = 4, partial: bool = True,
           recompute: bool = True) -> Pipeline:
    """Graft's three pipelines: old log-probs recomputed whenever staleness can be above 0 (``recompute``)."""
    if kind == "colocated":
        return Pipeline(kind, gpus, 0, max_staleness=0, buffer_batches=1)
    if kind == "one_step_off":
        return Pipeline(kind, gpus, rollout_gpus, max_staleness=1, buffer_batches=2,
                        recompute_old_logprobs=recompute)
    return Pipeline(kind, gpus, rollout_gpus, max_staleness=k, partial=partial,
                    buffer_batches=k + 1, recompute_old_logprobs=recompute)


def balanced_rollout_gpus(setup: Setup, gpus: int, recompute: bool = True, steps: int = 2,
                          seed: int = 0) -> int:
    """R that balances generation against training (with the old-log-prob pass) from one colocated run:
    R = G * gen / (gen + train), rounded to G/8 (it ignores the tail a split removes: errs towards more R)."""
    sim = Simulation(setup, preset("colocated", gpus), steps=steps, warmup=0, seed=seed)
    m = sim.run()
    train = (1 - m["trainer_idle_share"]) * m["step_time_s"]
    gen, train = m["step_time_s"] - train, train * (1 + setup.logprob_pass_fraction * recompute)
    unit = max(setup.gpus_per_engine, gpus // 8)
    r = round(gpus * gen / (gen + train) / unit) * unit
    return min(max(r, unit), gpus - unit)


def simulate(setup: Setup, pipe: Pipeline, steps: int = 4, warmup: int = 2, seed: int = 0) -> dict:
    """Metrics of one pipeline (see ``Simulation.run``)."""
    return Simulation(setup, pipe, steps, warmup, seed).run()


def predict(setup: Setup, gpus: int, k: int = 4, steps: int = 3, warmup: int = 2) -> dict:
    """The three Graft pipelines at ``gpus`` GPUs, R from ``balanced_rollout_gpus``."""
    r = balanced_rollout_gpus(setup, gpus)
    return {kind: simulate(setup, preset(kind, gpus, r, k), steps, warmup) for kind in PIPELINES}


def load_setup(path: Path, gpus: int | None = None) -> Setup:
    """Setup from an inputs file; with ``gpus``, prompts_per_step = prompts_per_gpu x gpus."""
    s = Setup.from_json(json.loads(Path(path).read_text()))
    if gpus and "prompts_per_gpu" in s.extra:
        s.prompts_per_step = int(s.extra["prompts_per_gpu"] * gpus)
    return s


def _table(rows: dict) -> str:
    head = "| setup | pipeline | R | step s | tok/s/GPU | trainer idle | rollout idle | staleness mean/max |"
    lines = [head, "|" + "---|" * 8]
    for key, res in rows.items():
        for kind, m in res.items():
            lines.append(f"| {key} | {kind} | {m['rollout_gpus']} | {m['step_time_s']:.3f} | "
                         f"{m['tokens_per_s_per_gpu']:,.0f} | {m['trainer_idle_share']:.0%} | "
                         f"{m['rollout_idle_share']:.0%} | "
                         f"{m['staleness_mean']:.2f} / {m['staleness_max']} |")
    return "\n".join(lines)


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--inputs", type=Path, default=RESULTS / "inputs_1p1b.json")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--rollout-gpus", type=int, default=0, help="R; 0: balanced from a colocated run")
    ap.add_argument("-k", "--max-staleness", type=int, default=4)
    ap.add_argument("--no-partial", action="store_true")
    ap.add_argument("--no-recompute", action="store_true", help="async modes train on the rollout log-probs")
    ap.add_argument("--make-inputs", action="store_true", help="rebuild the inputs files from bench/results")
    ap.add_argument("--predict", action="store_true", help="8/64/256 GPUs x 1.1B/8B -> predictions.json")
    ap.add_argument("--check-verl", action="store_true")
    ap.add_argument("--median", type=float, default=1500, help="--check-verl: response-length median")
    ap.add_argument("--sigma", type=float, default=1.0, help="--check-verl: response-length lognormal sigma")
    ap.add_argument("--measured", type=Path,
                    help="JSON spec of a measured run (see async_sim_inputs.compare_measured)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    sys.modules.setdefault("async_sim", sys.modules[__name__])  # one copy of the model when run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import async_sim_inputs as inputs  # bench/async_sim_inputs.py (it imports this module)

    if a.make_inputs:
        inputs.make_inputs(RESULTS.parent)
    if a.check_verl:
        res = inputs.check_verl(a.median, a.sigma)
        print(f"verl 128 H20, 64:64 fully async: predicted {res['predicted_ratio']:.2f}x vs published "
              f"{res['published_ratio']}x ({res['error']:+.1%}); steps "
              f"{res['colocated']['step_time_s']:.1f} s -> {res['fully_async']['step_time_s']:.1f} s "
              "(published 356.30 -> 150.63)")
        print(json.dumps(res["assumptions"], indent=1))
    elif a.measured:
        spec = json.loads(a.measured.read_text())
        modes = inputs.compare_measured(spec, a.measured.parent)
        for mode, r in modes.items():
            print(f"{mode}: predicted {r['predicted_step_time_s']:.3f} s, measured "
                  f"{r['measured_step_time_s']:.3f} s, error {r['error']:+.1%}")
        # the spec's record (measures, device, date, headline) makes the result a bench/README row
        res = {**spec.get("record", {}), "modes": modes,
               "command": "python3 bench/async_sim.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    elif a.predict:
        res = inputs.predictions(a.max_staleness)
        (a.out or RESULTS / "predictions.json").write_text(json.dumps(res, indent=1) + "\n")
        print(_table(res))
    else:
        setup = load_setup(a.inputs, a.gpus)
        r = a.rollout_gpus or (balanced_rollout_gpus(setup, a.gpus, not a.no_recompute) if a.gpus > 1 else 0)
        pipes = {kind: preset(kind, a.gpus, r, a.max_staleness, not a.no_partial, not a.no_recompute)
                 for kind in PIPELINES[:3 if r else 1]}
        res = {f"{a.inputs.stem}/{a.gpus}": {kind: simulate(setup, p) for kind, p in pipes.items()}}
        print(_table(res))
    if a.out and not a.predict:
        a.out.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
