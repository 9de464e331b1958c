"""The CUDA log-prob kernels (`graft.engine.head.triton_logprobs`) run by Triton's interpreter on CPU
tensors: the log-probs, ``logsumexp`` and logits' gradient equal to `graft.engine.head.logprobs`'
eager math within fp32 rounding, for a vocabulary of several blocks and a ragged last one,
per-token temperatures, labels at both ends of the vocabulary, fp32 and bf16 logits, and rows
with a stride; a row's forward the same bits alone as among others; a label outside the
vocabulary gives NaN.

usage: TRITON_INTERPRET=1 python logprobs_triton_interpret.py   (prints OK)
"""

from __future__ import annotations

import os

import torch

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

from graft.engine.head.logprobs import _backward_math, _forward_math  # noqa: E402
from graft.engine.head.triton_logprobs import BLOCK, triton_backward, triton_forward  # noqa: E402


def check(dtype: torch.dtype, vocab: int) -> None:
    torch.manual_seed(0)
    wide = (torch.randn(5, vocab + 7) * 4).to(dtype)
    logits = wide[:, :vocab]  # rows with a stride past their end
    labels = torch.tensor([0, vocab - 1, 3, BLOCK - 1 if vocab > BLOCK else 1, vocab // 2])
    inv_t = torch.tensor([1.0, 0.5, 2.0, 1.0, 1.3])
    grad = torch.randn(5)
    logp, lse = triton_forward(logits, labels, inv_t)
    want_logp, want_lse = _forward_math(logits, labels, inv_t)
    torch.testing.assert_close(logp, want_logp, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(lse, want_lse, rtol=1e-6, atol=1e-5)
    got = triton_backward(logits, labels, inv_t, lse, grad)
    want = _backward_math(logits, labels, inv_t, want_lse, grad)
    assert got.dtype == dtype and got.shape == logits.shape
    tolerance = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-2,
                                                                              "atol": 1e-3}
    torch.testing.assert_close(got, want, **tolerance)
    # one program per row: a row's log-prob is the same bits alone (graft-exact relies on it)
    alone, alone_lse = triton_forward(logits[3:4], labels[3:4], inv_t[3:4])
    assert torch.equal(alone, logp[3:4]) and torch.equal(alone_lse, lse[3:4])


def check_bad_label() -> None:
    logits = torch.randn(2, 50)
    logp, _ = triton_forward(logits, torch.tensor([3, 50]), torch.ones(2))
    assert not logp[0].isnan() and logp[1].isnan()


if __name__ == "__main__":
    for dtype in (torch.float32, torch.bfloat16):
        for vocab in (300, 2 * BLOCK + 123):
            check(dtype, vocab)
    check_bad_label()
    print("OK")
