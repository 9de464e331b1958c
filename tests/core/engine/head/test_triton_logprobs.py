"""The CUDA log-prob kernels (`graft.engine.head.triton_logprobs`) checked on CPU by Triton's
interpreter (tests/scripts/logprobs_triton_interpret.py); on the GPU by
bench/gpu/head_grads_check.py."""

from __future__ import annotations


def test_logprob_kernels_match_the_eager_math_under_the_interpreter(interpreted_ok) -> None:
    interpreted_ok("tests/scripts/logprobs_triton_interpret.py")
