"""The training engine: distributed setup, parallelization, packed micro-batches, forward.

Public API for model plugins (a family's own ``parallelize``; see docs/plugins.md, "Model
families and expert parallelism"). Importing this package is cheap: each name is loaded from its
module (which imports torch) on first access.

* The run's meshes: `ParallelMeshes` (``meshes["shard"]``, ``meshes["dp"]``, ``meshes["sp"]``,
  ``meshes["ep"]``, ``meshes["efsdp"]``).
* The parallelize steps, in the order a family's ``parallelize`` composes them:
  `apply_activation_checkpointing`, `apply_compile`, `apply_pre_shard_hooks` (must run, once,
  before sharding), `apply_expert_parallel` (experts over ``ep``), `apply_fsdp` with
  `mixed_precision_policy`; `parallelize_standard` is the core's own composition of them.
* Expert-parallel pieces for a hand-written experts forward: `shard_experts`,
  `dispatch_tokens`, `combine_tokens`, `grouped_linear`, `expert_weight`,
  `local_expert_weight`.
* Sequence parallelism, for a plugin whose attention spans the ``sp`` ranks
  (`graft.engine.distributed.sequence_parallel`): `SequenceShard` (this rank's part of every row) and
  `active_shard` (the shard of the split forward running now, or None).
* Which pass a forward belongs to (the ``phase`` of ``graft_prepare_inputs`` and
  ``graft_post_forward``): `Phase`, `PHASES`, `ROLLOUT_LOGPROBS`, `OLD_LOGPROBS`,
  `REF_LOGPROBS`, `UPDATE`, `SFT`.
* A plugin's own decode loop (``graft_static_decoder``): `compute` (one step of the model run
  inside every plugin's ``graft_compute`` wrapper), the rollout's steps it names (`PREFILL`,
  `DECODE`, `SAMPLE_LOGPROBS`, in the phase `ROLLOUT`) and `token_logprobs` (the sampled
  tokens' log-probs, fp32, the trainer's own function).
* Token-chunked autograd functions (the core's chunked head, a plugin's tiled module
  forward): `token_chunks` (the chunks' slices), `add_chunk_grads` (parameter gradients summed
  over the chunks in fp32) and `cast_like` (the sums back in the parameters' dtypes).
* This process's place in the run, for a plugin's rollout engine or sink: `DistEnv` (rank,
  world size, device, meshes, role), `broadcast_object` (rank 0's small picklable value on
  every rank) and `ranks_share_gpus` (more ranks than GPUs on this node).

Everything else under ``graft.engine.*`` is the core's own and may change without notice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from graft.lazy import lazy_attributes

if TYPE_CHECKING:
    from graft.engine.distributed.env import DistEnv, broadcast_object, ranks_share_gpus
    from graft.engine.distributed.expert_parallel import (
        apply_expert_parallel,
        combine_tokens,
        dispatch_tokens,
        expert_weight,
        grouped_linear,
        local_expert_weight,
        shard_experts,
    )
    from graft.engine.distributed.parallel_dims import ParallelMeshes
    from graft.engine.distributed.parallelize import (
        apply_activation_checkpointing,
        apply_compile,
        apply_fsdp,
        apply_pre_shard_hooks,
        mixed_precision_policy,
        parallelize_standard,
    )
    from graft.engine.distributed.sequence_parallel import SequenceShard, active_shard
    from graft.engine.head.logprobs import token_logprobs
    from graft.engine.head.token_chunks import add_chunk_grads, cast_like, token_chunks
    from graft.engine.phase import (
        DECODE,
        OLD_LOGPROBS,
        PHASES,
        PREFILL,
        REF_LOGPROBS,
        ROLLOUT,
        ROLLOUT_LOGPROBS,
        SAMPLE_LOGPROBS,
        SFT,
        UPDATE,
        Phase,
        compute,
    )

__all__ = [
    "DECODE",
    "OLD_LOGPROBS",
    "PHASES",
    "PREFILL",
    "REF_LOGPROBS",
    "ROLLOUT",
    "ROLLOUT_LOGPROBS",
    "SAMPLE_LOGPROBS",
    "SFT",
    "UPDATE",
    "DistEnv",
    "ParallelMeshes",
    "Phase",
    "SequenceShard",
    "active_shard",
    "add_chunk_grads",
    "apply_activation_checkpointing",
    "apply_compile",
    "apply_expert_parallel",
    "apply_fsdp",
    "apply_pre_shard_hooks",
    "broadcast_object",
    "cast_like",
    "combine_tokens",
    "compute",
    "dispatch_tokens",
    "expert_weight",
    "grouped_linear",
    "local_expert_weight",
    "mixed_precision_policy",
    "parallelize_standard",
    "ranks_share_gpus",
    "shard_experts",
    "token_chunks",
    "token_logprobs",
]

_MODULE_OF = {
    **dict.fromkeys(["add_chunk_grads", "cast_like", "token_chunks"],
                    "graft.engine.head.token_chunks"),
    **dict.fromkeys(["DistEnv", "broadcast_object", "ranks_share_gpus"],
                    "graft.engine.distributed.env"),
    **dict.fromkeys(["apply_expert_parallel", "combine_tokens", "dispatch_tokens",
                     "expert_weight", "grouped_linear", "local_expert_weight", "shard_experts"],
                    "graft.engine.distributed.expert_parallel"),
    "ParallelMeshes": "graft.engine.distributed.parallel_dims",
    **dict.fromkeys(["apply_activation_checkpointing", "apply_compile", "apply_fsdp",
                     "apply_pre_shard_hooks", "mixed_precision_policy", "parallelize_standard"],
                    "graft.engine.distributed.parallelize"),
    **dict.fromkeys(["SequenceShard", "active_shard"], "graft.engine.distributed.sequence_parallel"),
    **dict.fromkeys(["DECODE", "OLD_LOGPROBS", "PHASES", "PREFILL", "REF_LOGPROBS", "ROLLOUT",
                     "ROLLOUT_LOGPROBS", "SAMPLE_LOGPROBS", "SFT", "UPDATE", "Phase", "compute"],
                    "graft.engine.phase"),
    "token_logprobs": "graft.engine.head.logprobs",
}


__getattr__ = lazy_attributes(__name__, _MODULE_OF)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
