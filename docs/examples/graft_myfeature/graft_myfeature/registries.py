"""Registry entries, selected by name in the config: an advantage estimator, a policy loss and a
reward."""

import os

from graft import hookimpl
from graft.losses import token_separable


def pairwise_advantages(rewards, *, group_size):
    """Each sample's wins minus losses against the others of its group, over n - 1: blind to the
    reward's scale, and exactly 0 for a group of equal rewards."""
    import torch

    groups = rewards.reshape(-1, group_size)
    wins = torch.sign(groups[:, :, None] - groups[:, None, :]).sum(-1)
    return (wins / (group_size - 1)).reshape(-1)


@token_separable
def capped_is_loss(*, logp, advantages, root_cfg, tensors):
    """REINFORCE weighted by the trainer-over-engine probability ratio, capped at
    features.myfeature.is_cap (`tensors` holds every per-token tensor of the micro-batch)."""
    import torch

    cap = root_cfg.features.myfeature.is_cap
    weight = torch.exp(logp.detach() - tensors["rollout_logprobs"]).clamp(max=cap)
    return -advantages * weight * logp, {"is_weight": weight}


def prefix_reward(*, response, sample):
    """The share of the answer the response starts with: partial credit (a reward gets the
    keywords it names of response, sample and cfg)."""
    answer = sample.answer or ""
    return len(os.path.commonprefix([response, answer])) / max(len(answer), 1)


@hookimpl
def graft_advantage_estimators():
    from graft.rl import AdvantageEstimator

    return {"pairwise": AdvantageEstimator(pairwise_advantages, min_group_size=2)}


@hookimpl
def graft_policy_losses():
    return {"capped-is": capped_is_loss}


@hookimpl
def graft_reward_functions():
    return {"prefix": prefix_reward}
