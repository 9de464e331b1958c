"""Registers the reward ``needs_dep``, which runs in worker processes that preload the missing
module ``graft_absent_dependency`` (as graft-math preloads math_verify)."""

from graft import hookimpl


def needs_dep(response: str) -> float:
    """1.0 once the missing dependency imports (it never does here)."""
    import graft_absent_dependency  # noqa: F401

    return 1.0


@hookimpl
def graft_reward_functions():
    """``needs_dep`` in a process pool, preloading its dependency."""
    from graft.rl import RewardFunction

    return {"needs_dep": RewardFunction(needs_dep, pool="process",
                                        preload=("graft_absent_dependency",))}
