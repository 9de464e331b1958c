"""Distributed training: processes and meshes, parallelization (FSDP2, expert and sequence
parallelism, activation checkpointing), the model built over the meshes, the gradient norm.

The core's own modules: plugins use the names `graft.engine` exports."""
