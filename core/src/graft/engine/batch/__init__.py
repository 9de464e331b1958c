"""Packed micro-batches: samples assigned under a token budget, rows packed, labels rolled,
padding and unpadding.

The core's own modules: plugins use the names `graft.engine` exports."""
