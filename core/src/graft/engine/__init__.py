"""The training engine: distributed setup, parallelization, packed micro-batches, forward."""
