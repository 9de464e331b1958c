"""Record in one pass, find it again in the next: what routing replay does, on a toy scale.

An RL step that updates more than once first runs the old-log-prob pass over its micro-batches;
a tensor `graft_post_forward` returns is kept with its micro-batch, and every later pass over
that micro-batch (phase "update") finds it in `batch`. Here the kept tensor is the token ids, and
the update counts the tokens it finds again.
"""

from graft import hookimpl

replayed = {"tokens": 0}  # this process's count for the current step


@hookimpl
def graft_step_begin():
    replayed["tokens"] = 0


@hookimpl
def graft_post_forward(batch, layout, phase, cfg):
    if phase != "old_logprobs" or not cfg.features.myfeature.enabled:
        return None
    per_sample = layout.unpad(batch["input_ids"])            # one tensor per sample, no pad
    return {"myfeature_ids": layout.pack(per_sample, fill=-1)}  # -1 where the pad is


@hookimpl
def graft_prepare_inputs(batch, phase):
    if phase == "update" and "myfeature_ids" in batch:
        kept = batch["myfeature_ids"].to(batch["input_ids"].device)
        replayed["tokens"] += int((kept == batch["input_ids"]).sum())


@hookimpl
def graft_step_end(metrics):
    metrics["myfeature/replayed_tokens"] = float(replayed["tokens"])
