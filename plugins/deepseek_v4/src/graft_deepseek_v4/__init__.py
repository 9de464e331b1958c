"""graft-deepseek-v4: the DeepSeek-V4 model family for Graft (entry point ``deepseek_v4``) and its
quantisation-aware training (``features.deepseek_v4.qat``; quantisers in
`graft_deepseek_v4.quant`)."""

__version__ = "0.1.0"
