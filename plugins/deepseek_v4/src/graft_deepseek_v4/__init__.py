"""graft-deepseek-v4: the DeepSeek-V4 model family for Graft (entry point ``deepseek_v4``)."""

__version__ = "0.1.0"
