"""`PoolExecutor`: graft-reward-pool's `graft.rl.RewardExecutor`, a `RewardPool` of threads and
one of processes, each reward in the one it declares (`graft.rl.RewardFunction.pool`) or the one
``features.reward_pool.kind`` names, each sample within ``features.reward_pool.timeout_s``."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from graft_reward_pool.config import reward_pool_section
from graft_reward_pool.pool import PoolResult, RewardPool

if TYPE_CHECKING:
    from graft.config import GraftConfig
    from graft.rl import RewardFunction

logger = logging.getLogger("graft_reward_pool")

KINDS = ("thread", "process")


class PoolExecutor:
    """Two pools (threads, processes) of ``features.reward_pool.workers`` workers each, started
    on first use or by `start`; the rewards get the root config ``cfg``. `metrics` counts the
    samples of the last batch that ran past the time limit (``reward_timeouts``)."""

    def __init__(self, *, cfg: GraftConfig) -> None:
        section = reward_pool_section(cfg)
        self.forced = None if section.kind == "auto" else section.kind
        self.pools = {kind: RewardPool(kind, workers=section.workers,
                                       timeout_s=section.timeout_s, cfg=cfg) for kind in KINDS}
        self.timeouts = 0

    def kind(self, reward: RewardFunction) -> str:
        """The pool ``reward`` runs in."""
        return self.forced or reward.pool

    def start(self, rewards: Sequence[RewardFunction]) -> None:
        """Start the pools ``rewards`` run in now, their processes importing what the rewards
        preload, so the first batch does not wait for them."""
        needed: dict[str, list[RewardFunction]] = {}
        for reward in rewards:
            needed.setdefault(self.kind(reward), []).append(reward)
        for kind, chosen in needed.items():
            self.pools[kind].start(tuple(m for reward in chosen for m in reward.preload))

    def score(self, tasks: Sequence[tuple[RewardFunction, str, Any]]) -> PoolResult:
        """Every task's score, in order, each in its reward's pool; a sample past the time limit
        scores 0 (``timed_out``, with a warning)."""
        groups: dict[str, list[int]] = {kind: [] for kind in KINDS}
        for index, (reward, _, _) in enumerate(tasks):
            groups[self.kind(reward)].append(index)
        result = PoolResult([0.0] * len(tasks))
        self.timeouts = 0
        for kind, indices in groups.items():
            if not indices:
                continue
            part = self.pools[kind].score([tasks[i] for i in indices])
            for index, value in zip(indices, part.scores, strict=True):
                result.scores[index] = value
            result.failures.update((indices[position], failure)
                                   for position, failure in part.failures.items())
            result.timed_out.extend(indices[position] for position in part.timed_out)
            for position in part.timed_out:
                logger.warning("the reward of %s took longer than features.reward_pool.timeout_s="
                               "%s and scores 0", tasks[indices[position]][2].origin
                               or "a sample", self.pools[kind].timeout_s)
        self.timeouts = len(result.timed_out)
        result.timed_out.sort()
        return result

    def metrics(self) -> dict[str, float]:
        """This rank's count of the last batch's samples past the time limit (scored 0)."""
        return {"reward_timeouts": float(self.timeouts)}

    def close(self) -> None:
        """Stop the worker threads and processes (idempotent)."""
        for pool in self.pools.values():
            pool.close()
