"""The reward registry (core and plugins), which reward scores each sample, and scoring a batch.

A registry entry is a function or a `RewardFunction` (the function, the ``data_source`` values
it scores under ``algorithm.reward=auto``, and whether it runs in threads or processes). Every
reward is called with keyword arguments, getting those it declares of ``response`` (the
decoded response, without special tokens), ``sample`` (the `graft.data.tasks.TextSample` it
answers: ``prompt``, ``answer``, ``data_source``, ``extra_info``, ``origin``) and ``cfg`` (the
root config), and returns a number. A reward that raises or returns no finite number (NaN, inf,
a string) fails its sample: ``algorithm.reward_errors=stop`` (the default) stops the run with a
`PluginError` naming the reward and the sample, ``zero`` scores the sample 0 and counts it in
``reward_errors``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from graft.data.tasks import TASKS, TextSample
from graft.errors import ConfigError, PluginError
from graft.plugins import GraftPluginManager, get_plugin_manager
from graft.plugins.registry import collect_named

logger = logging.getLogger("graft.rl")

if TYPE_CHECKING:
    from graft.config.schema import GraftConfig
    from graft.rl.reward_pool import RewardFailure

RewardFn = Callable[..., float]
POOLS = ("thread", "process")


@dataclass(frozen=True)
class RewardFunction:
    """A reward with what the core needs to know to pick it and run it.

    ``fn``: the reward (keywords ``response``, ``sample``, ``cfg``; any subset). ``data_sources``:
    the ``data_source`` values (verl's column: ``openai/gsm8k``, ``lighteval/MATH``...) whose
    samples ``algorithm.reward=auto`` scores with it; two rewards claiming one value is an
    error. ``pool``: where it runs under ``algorithm.reward_pool=auto``: ``thread`` (cheap or
    I/O-bound: a call to a reward server) or ``process`` (CPU-bound Python such as sympy, which
    threads would run one at a time under the GIL; a sample past ``algorithm.reward_timeout_s``
    is stopped by killing its worker). A ``process`` reward must be a module-level function
    (it is pickled by name). ``preload``: modules a worker imports before it starts the clock
    on its first sample (the reward's heavy dependencies, when its own module imports them
    lazily to keep config validation fast).
    """

    fn: RewardFn
    data_sources: tuple[str, ...] = ()
    pool: str = "thread"
    preload: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.pool not in POOLS:
            raise ValueError(f"RewardFunction.pool must be one of {POOLS}, got {self.pool!r}")
        for name in ("data_sources", "preload"):  # a bare string would be read letter by letter
            if isinstance(getattr(self, name), str):
                object.__setattr__(self, name, (getattr(self, name),))


def reward_functions(manager: GraftPluginManager | None = None) -> dict[str, RewardFunction]:
    """Every reward by name (plain functions wrapped as `RewardFunction`); two providers of one
    name is a `PluginError` naming both."""
    found = collect_named(manager or get_plugin_manager(), "graft_reward_functions", "reward")
    return {name: value if isinstance(value, RewardFunction) else RewardFunction(value)
            for name, value in found.items()}


def reward_names(manager: GraftPluginManager | None = None) -> list[str]:
    """Names valid for ``algorithm.reward`` (besides ``auto``)."""
    return sorted(reward_functions(manager))


def data_source_rewards(rewards: dict[str, RewardFunction]) -> dict[str, str]:
    """``data_source`` value -> the name of the reward that declares it; a value declared by two
    rewards is a `PluginError` naming both."""
    owner: dict[str, str] = {}
    for name, reward in rewards.items():
        for source in reward.data_sources:
            if source in owner:
                raise PluginError(f"the rewards {owner[source]!r} and {name!r} both declare "
                                  f"data_source {source!r}; disable one plugin or set "
                                  f"algorithm.reward to the one you want")
            owner[source] = name
    return owner


def resolve_reward(name: str, data_source: str) -> RewardFn:
    """The reward function ``algorithm.reward=name`` uses for ``data.source=data_source`` when
    samples carry no ``data_source`` of their own: ``auto`` is the synthetic task's reward, else
    exact match against the answer."""
    rewards = reward_functions()
    if name == "auto":
        return TASKS[data_source].reward if data_source in TASKS else rewards["exact_match"].fn
    return rewards[name].fn


class RewardChooser:
    """Which reward scores a sample, for ``algorithm.reward`` and ``data.source``.

    A registered name scores every sample. ``auto`` scores a sample whose ``data_source`` a
    reward declares (`RewardFunction.data_sources`) with that reward; any other sample with the
    synthetic task's reward, or exact match for file data.
    """

    def __init__(self, name: str, data_source: str,
                 manager: GraftPluginManager | None = None) -> None:
        self.rewards = reward_functions(manager)
        if name != "auto" and name not in self.rewards:
            raise ConfigError(f"algorithm.reward={name!r} is no registered reward; known: "
                              f"{', '.join(sorted(self.rewards))}")
        self.name = name
        self.by_source = data_source_rewards(self.rewards) if name == "auto" else {}
        # auto, for a sample whose data_source no reward declares
        self.fallback = (RewardFunction(TASKS[data_source].reward) if data_source in TASKS
                         else self.rewards["exact_match"])

    def __call__(self, sample: TextSample) -> RewardFunction:
        """The reward for ``sample``."""
        if self.name != "auto":
            return self.rewards[self.name]
        chosen = self.by_source.get(sample.data_source)
        return self.rewards[chosen] if chosen is not None else self.fallback


def _origin(sample: TextSample) -> str:
    """Where ``sample`` comes from (its file and row), else its prompt's start."""
    return sample.origin or f"the sample with the prompt {str(sample.prompt)[:60]!r}"


class RewardScorer:
    """Scores a step's responses: each sample's reward (`RewardChooser`), run in a pool of
    ``algorithm.reward_workers`` threads or processes (`graft.rl.reward_pool.RewardPool`), each
    sample within ``algorithm.reward_timeout_s`` (past it the sample scores 0 and is counted in
    ``reward_timeouts``). A sample whose reward fails (raises, returns no finite number, ends
    its worker process) stops the run under ``algorithm.reward_errors=stop``; under ``zero`` it
    scores 0 and is counted in ``reward_errors``. The pools start on first use, or with
    ``samples`` (the dataset) at once the pools their rewards need, so worker processes start
    while the model loads; `close` stops them. ``cfg`` is the root config (the rewards get it
    whole)."""

    def __init__(self, samples: Sequence[TextSample] = (),
                 manager: GraftPluginManager | None = None, *, cfg: GraftConfig) -> None:
        from graft.rl.reward_pool import RewardPool

        algorithm = cfg.algorithm
        self.choose = RewardChooser(algorithm.reward, cfg.data.source, manager)
        self.names = {id(reward): name for name, reward in self.choose.rewards.items()}
        self.on_error = algorithm.reward_errors
        self.errors = 0
        self.forced_pool = None if algorithm.reward_pool == "auto" else algorithm.reward_pool
        self.pools = {kind: RewardPool(kind, workers=algorithm.reward_workers,
                                       timeout_s=algorithm.reward_timeout_s, cfg=cfg)
                      for kind in POOLS}
        self.timeouts = 0
        needed: dict[str, list[RewardFunction]] = {}
        for reward in {self.choose(sample) for sample in samples}:
            needed.setdefault(self.forced_pool or reward.pool, []).append(reward)
        for kind, rewards in needed.items():
            self.pools[kind].start(tuple(m for reward in rewards for m in reward.preload))

    def score(self, responses: Sequence[str], samples: Sequence[TextSample]) -> list[float]:
        """One reward per response (``responses[i]`` answers ``samples[i]``), in order."""
        if len(responses) != len(samples):
            raise ValueError(f"{len(responses)} responses for {len(samples)} samples")
        groups: dict[str, list[int]] = {kind: [] for kind in POOLS}
        chosen = [self.choose(sample) for sample in samples]
        for index, reward in enumerate(chosen):
            groups[self.forced_pool or reward.pool].append(index)
        scores = [0.0] * len(samples)
        failures: dict[int, RewardFailure] = {}
        self.timeouts = self.errors = 0
        for kind, indices in groups.items():
            if not indices:
                continue
            result = self.pools[kind].score([(chosen[i], responses[i], samples[i])
                                             for i in indices])
            for index, value in zip(indices, result.scores, strict=True):
                scores[index] = value
            failures.update((indices[position], failure)
                            for position, failure in result.failures.items())
            self.timeouts += len(result.timed_out)
            for position in result.timed_out:
                logger.warning("the reward of %s took longer than algorithm.reward_timeout_s="
                               "%s and scores 0", samples[indices[position]].origin
                               or "a sample", self.pools[kind].timeout_s)
        if failures:
            self._failed(failures, chosen, samples)
        return scores

    def _failed(self, failures: dict[int, RewardFailure], chosen: list[RewardFunction],
                samples: Sequence[TextSample]) -> None:
        """Stop (``reward_errors=stop``) with the first failure, or count them (``zero``: they
        scored 0) with one warning for the batch."""
        from graft.rl.reward_pool import debug_trace, reward_name

        first = min(failures)
        reward = chosen[first]
        label = (f"{self.names[id(reward)]!r} ({reward_name(reward.fn)})"
                 if id(reward) in self.names else reward_name(reward.fn))
        message = failures[first].describe(label, _origin(samples[first]))
        trace = failures[first].trace
        if self.on_error == "stop":
            raise PluginError(f"{message}. Fix the reward, or set algorithm.reward_errors=zero to "
                              f"score a failing sample 0 and count it (metric reward_errors)"
                              f"{debug_trace(trace)}")
        self.errors = len(failures)
        logger.warning("%d of %d rewards failed and score 0 (algorithm.reward_errors=zero); the "
                       "first: %s%s", len(failures), len(samples), message, debug_trace(trace))

    def metrics(self) -> dict[str, float]:
        """This rank's counts of samples of the last `score` that ran past the timeout and
        whose reward failed (``algorithm.reward_errors=zero``); both scored 0."""
        return {"reward_timeouts": float(self.timeouts), "reward_errors": float(self.errors)}

    def close(self) -> None:
        """Stop the worker threads and processes (idempotent)."""
        for pool in self.pools.values():
            pool.close()
