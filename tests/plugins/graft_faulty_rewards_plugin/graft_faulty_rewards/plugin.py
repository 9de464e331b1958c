"""``nan_reward`` returns NaN for every response; ``raising_reward`` raises for every response."""

from graft import hookimpl


def nan_reward(response: str) -> float:
    """NaN, as a reward that divides 0 by 0 would give."""
    return float("nan")


def raising_reward(response: str) -> float:
    """Raises, as a buggy reward does."""
    return len(response) / 0


@hookimpl
def graft_reward_functions():
    """The two failing rewards (in threads)."""
    return {"nan_reward": nan_reward, "raising_reward": raising_reward}
