"""The LM head's log-probabilities: chunked over tokens (with the loss fused in), their
gradients chunk by chunk, and the Triton kernel for them.

The core's own modules: plugins use the names `graft.engine` exports."""
