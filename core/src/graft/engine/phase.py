"""Which pass a packed forward belongs to: the ``phase`` of ``graft_prepare_inputs`` and
``graft_post_forward``.

An RL step runs, over the same micro-batches, the policy's old-log-prob pass, the reference's
pass (KL penalty), then the update passes; a plugin that records in one pass and replays in the
next (routing replay: R2 records in ``old_logprobs``) tells them apart by this name.
"""

from __future__ import annotations

from typing import Literal

Phase = Literal["rollout_logprobs", "old_logprobs", "ref_logprobs", "update", "sft"]

ROLLOUT_LOGPROBS: Phase = "rollout_logprobs"  # the trainer scores samples the engine gave no log-probs
OLD_LOGPROBS: Phase = "old_logprobs"  # the policy before the update (no grad)
REF_LOGPROBS: Phase = "ref_logprobs"  # the frozen KL reference (no grad)
UPDATE: Phase = "update"  # RL forward + backward
SFT: Phase = "sft"  # supervised forward + backward

PHASES: tuple[Phase, ...] = (ROLLOUT_LOGPROBS, OLD_LOGPROBS, REF_LOGPROBS, UPDATE, SFT)
