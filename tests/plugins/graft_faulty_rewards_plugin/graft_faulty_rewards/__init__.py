"""Rewards that fail, for the tests of algorithm.reward_errors."""
