"""The reward registry (core and plugins), which reward scores each sample, and scoring a batch.

A registry entry is a function or a `RewardFunction` (the function, the ``data_source`` values
it scores under ``algorithm.reward=auto``, and where an executor should run it). Every
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
    from graft.rl.reward_executor import RewardExecutor, RewardFailure

RewardFn = Callable[..., float]
# Where a reward wants to run (`RewardFunction.pool`), for an executor that honours it.
POOLS = ("thread", "process")


@dataclass(frozen=True)
class RewardFunction:
    """A reward with what the core needs to know to pick it and run it.

    ``fn``: the reward (keywords ``response``, ``sample``, ``cfg``; any subset). ``data_sources``:
    the ``data_source`` values (verl's column: ``openai/gsm8k``, ``lighteval/MATH``...) whose
    samples ``algorithm.reward=auto`` scores with it; two rewards claiming one value is an
    error. ``pool`` and ``preload`` are declarations a `graft.rl.RewardExecutor` may honour
    (graft-reward-pool's does; the core's, without such a plugin, calls every reward in the
    trainer's thread and uses neither). ``pool``: where the reward wants to run: ``thread``
    (cheap or I/O-bound: a call to a reward server) or ``process`` (CPU-bound Python such as
    sympy, which threads would run one at a time under the GIL; a sample past the executor's
    time limit is stopped by killing its worker). A ``process`` reward must be a module-level
    function (it is pickled by name). ``preload``: modules a worker imports before it starts
    the clock on its first sample (the reward's heavy dependencies, when its own module imports
    them lazily to keep config validation fast).
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
    """Scores a step's responses: each sample's reward (`RewardChooser`), run by the
    `graft.rl.RewardExecutor` a ``graft_reward_executor`` plugin returns (graft-reward-pool: a
    pool of threads or processes, each sample within a time limit), else in the calling thread,
    in order, without a time limit (`graft.rl.InlineRewards`). A sample whose
    reward fails (raises, returns no finite number, ends its worker process) stops the run under
    ``algorithm.reward_errors=stop``; under ``zero`` it scores 0 and is counted in
    ``reward_errors``. The executor starts with ``samples`` (the dataset) the rewards they need,
    so worker processes start while the model loads; `close` stops it. ``cfg`` is the root
    config (the rewards get it whole); ``manager`` the plugin manager (the process's by
    default)."""

    def __init__(self, samples: Sequence[TextSample] = (),
                 manager: GraftPluginManager | None = None, *, cfg: GraftConfig) -> None:
        from graft.rl.reward_executor import InlineRewards

        algorithm = cfg.algorithm
        self.choose = RewardChooser(algorithm.reward, cfg.data.source, manager)
        self.names = {id(reward): name for name, reward in self.choose.rewards.items()}
        self.on_error = algorithm.reward_errors
        self.errors = 0
        hook = (manager or get_plugin_manager()).hook
        self.executor: RewardExecutor = (hook.graft_reward_executor(cfg=cfg)
                                         or InlineRewards(cfg=cfg))
        self.executor.start(list(dict.fromkeys(self.choose(sample) for sample in samples)))

    def score(self, responses: Sequence[str], samples: Sequence[TextSample]) -> list[float]:
        """One reward per response (``responses[i]`` answers ``samples[i]``), in order."""
        if len(responses) != len(samples):
            raise ValueError(f"{len(responses)} responses for {len(samples)} samples")
        chosen = [self.choose(sample) for sample in samples]
        self.errors = 0
        result = self.executor.score(list(zip(chosen, responses, samples, strict=True)))
        if result.failures:
            self._failed(result.failures, chosen, samples)
        return list(result.scores)

    def _failed(self, failures: dict[int, RewardFailure], chosen: list[RewardFunction],
                samples: Sequence[TextSample]) -> None:
        """Stop (``reward_errors=stop``) with the first failure, or count them (``zero``: they
        scored 0) with one warning for the batch."""
        from graft.rl.reward_executor import debug_trace, reward_name

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
        """This rank's counts for the last `score`: the executor's (graft-reward-pool's
        ``reward_timeouts``: samples past its time limit) and ``reward_errors``, the samples
        whose reward failed (``algorithm.reward_errors=zero``); both scored 0."""
        return {**self.executor.metrics(), "reward_errors": float(self.errors)}

    def close(self) -> None:
        """Stop the executor's workers (idempotent)."""
        self.executor.close()
