"""Rollout engines for RL: the trainer's own model (embedded) or vLLM, behind one interface."""

from graft.rollout.types import RolloutSample, SamplingSpec

__all__ = ["RolloutSample", "SamplingSpec"]
