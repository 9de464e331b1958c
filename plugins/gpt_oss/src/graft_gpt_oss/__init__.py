"""graft-gpt-oss: the GPT-OSS model family for Graft (entry point ``gpt_oss``)."""

__version__ = "0.1.0"
