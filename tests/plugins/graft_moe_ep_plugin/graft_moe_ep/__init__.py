"""Test plugin: the qwen3_moe family with ``engine.ep_size > 1`` (core helpers only)."""
