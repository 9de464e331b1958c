"""Reinforcement learning: rewards, advantages, KL penalty and the RL step."""
