"""`TrainEngine`: a parallelized model and its optimizer, driven one mini-batch at a time.

The same engine serves SFT and RL: the caller passes token samples (plus per-token extras such as
old log-probs and advantages) and a loss function over ``(num_sequences, max_len)`` matrices;
the engine packs micro-batches, keeps the number of micro-batches equal on every rank (FSDP2
collectives must match), computes global normalisers, and runs forward/backward and the step.
With sequence parallelism each forward runs on this rank's part of every row and its outputs are
gathered into whole rows (`graft.engine.distributed.sequence_parallel`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from graft.engine.batch.micro_batch import MicroBatch, TokenSample, build_micro_batch
from graft.engine.batch.packing import plan_micro_batches
from graft.engine.distributed.env import DistEnv, all_reduce
from graft.engine.distributed.grad_norm import clip_grad_norm
from graft.engine.distributed.sequence_parallel import (
    SequenceShard,
    backward_scale,
    row_multiple,
    sequence_split,
    split_tensors,
)
from graft.engine.forward import forward_fused_loss, forward_logprobs
from graft.engine.head.fused_loss import TokenLoss
from graft.engine.head.token_loss import LossFn, chunk_token_loss, fuses_loss, token_weights
from graft.engine.phase import BACKWARD, FORWARD, GRADIENT, SFT, UPDATE, Phase, compute
from graft.errors import PluginError
from graft.losses.aggregation import AggregationContext
from graft.losses.registry import aggregate_loss
from graft.models.family import ModelFamily
from graft.plugins import get_plugin_manager

if TYPE_CHECKING:
    from graft.config.schema import GraftConfig

T = TypeVar("T")


@dataclass
class UpdateResult:
    """What one mini-batch's forward/backward produced, reduced over all ranks."""

    loss: float
    tokens: int
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class PendingUpdate:
    """Device-side totals of a forward/backward, reduced only when `result` is called.

    Reading them forces a device sync; deferring that until after the optimizer step keeps the
    GPU busy while the CPU queues the step.
    """

    loss_total: torch.Tensor
    tokens: int
    sums: dict[str, torch.Tensor]
    ctx: AggregationContext
    # The data-parallel group: the sp ranks of one data-parallel rank hold the same totals.
    group: Any = None

    def result(self) -> UpdateResult:
        """All-reduce over the data-parallel ranks and convert to floats (metrics are averaged
        over the mask)."""
        names = sorted(self.sums)
        device = self.loss_total.device
        packed = torch.stack([self.loss_total,
                              torch.tensor(float(self.tokens), dtype=torch.float64, device=device),
                              *[self.sums[n].to(device) for n in names]])
        values = all_reduce(packed, group=self.group).tolist()
        metrics = {n: values[2 + i] / max(self.ctx.global_tokens, 1.0) for i, n in enumerate(names)}
        return UpdateResult(values[0] / self.ctx.dp_size, int(values[1]), metrics)


def merge_kept(results: Sequence[dict[str, torch.Tensor] | None]) -> dict[str, torch.Tensor]:
    """One dict from the ``graft_post_forward`` results; a name returned twice is an error."""
    merged: dict[str, torch.Tensor] = {}
    for result in results:
        for name, tensor in (result or {}).items():
            if name in merged:
                raise PluginError(f"two graft_post_forward plugins returned the tensor {name!r}; "
                                  f"rename one of them")
            merged[name] = tensor
    return merged


@dataclass
class TrainEngine:
    """The sharded model, optimizer and schedule of a run, with the config that shapes them.

    ``cfg`` is the root config: the engine reads ``cfg.engine``, ``cfg.loss.loss_agg_mode`` and
    ``cfg.optim.max_grad_norm``, and passes all of it to the plugins' forward hooks."""

    model: torch.nn.Module
    family: ModelFamily
    optimizer: torch.optim.Optimizer | None  # None for a frozen model (the KL reference)
    scheduler: torch.optim.lr_scheduler.LRScheduler | None
    env: DistEnv
    cfg: GraftConfig
    compute_dtype: torch.dtype
    pad_token_id: int
    # optimizer steps skipped because the gradient norm was not finite (`optimizer_step`)
    skipped_updates: int = 0
    # where a message for the console goes (the trainer's `graft.training.metrics.console_print`)
    say: Callable[[str], None] = print

    def micro_batches(self, samples: Sequence[TokenSample], *,
                      extras: Mapping[str, Sequence[torch.Tensor]] | None = None,
                      temperatures: Sequence[float] | None = None) -> list[MicroBatch]:
        """Pack this rank's ``samples`` into as many micro-batches as the busiest rank needs."""
        engine = self.cfg.engine
        lengths = [len(s) for s in samples]
        plan = dict(token_budget=engine.max_tokens_per_micro_batch,
                    packs_sequences=self.family.packs_sequences,
                    linear_weight=24 * int(getattr(self.model.config, "hidden_size", 64)))
        groups = plan_micro_batches(lengths, **plan)
        while True:  # agree on a count every rank can reach; every rank runs the same rounds
            count = int(all_reduce(torch.tensor([len(groups)], device=self.env.device),
                                   op=torch.distributed.ReduceOp.MAX,
                                   group=self.env.group).item())
            if len(groups) < count:  # the planner may need more than asked for
                groups = plan_micro_batches(lengths, min_micro_batches=count, **plan)
            agreed = all_reduce(torch.tensor([int(len(groups) == count)], device=self.env.device),
                                op=torch.distributed.ReduceOp.MIN, group=self.env.group)
            if int(agreed.item()):
                break
        bucket = row_multiple(engine.pad_to_length_bucket if engine.pad_to_length else None,
                              self.env.sp_size)
        return [build_micro_batch(
            [samples[i] for i in group], packs_sequences=self.family.packs_sequences,
            pad_token_id=self.pad_token_id, pad_bucket=bucket,
            temperatures=None if temperatures is None else [temperatures[i] for i in group],
            extras={k: [v[i] for i in group] for k, v in (extras or {}).items()},
            max_row_tokens=engine.max_tokens_per_row or None,
        ) for group in groups]

    def aggregation_context(self, micro_batches: Sequence[MicroBatch],
                            loss_scale_factor: float) -> AggregationContext:
        """Token and sequence counts of the whole mini-batch, over all data-parallel ranks."""
        tokens = sum(float(mb.tensors["loss_mask"].sum()) for mb in micro_batches)
        sequences = sum(float((mb.to_sequences(mb.tensors["loss_mask"]).sum(-1) > 0).sum())
                        for mb in micro_batches)
        counts = all_reduce(torch.tensor([tokens, sequences], dtype=torch.float64,
                                         device=self.env.device), group=self.env.dp_group)
        return AggregationContext(float(counts[0]), float(counts[1]), self.env.dp_size,
                                  loss_scale_factor)

    def forward_backward(self, micro_batches: Sequence[MicroBatch], loss_fn: LossFn, *,
                         loss_scale_factor: float, with_entropy: bool = False,
                         phase: Phase = UPDATE) -> PendingUpdate:
        """Accumulate gradients over ``micro_batches``; the loss is aggregated by mode.

        ``phase`` (``update`` or ``sft``) is what the plugins' forward hooks are told.
        """
        if phase not in (UPDATE, SFT):
            raise ValueError(f"forward_backward runs the update or sft phase, not {phase!r}")
        ctx = self.aggregation_context(micro_batches, loss_scale_factor)
        mode = self.cfg.loss.loss_agg_mode
        fused = fuses_loss(loss_fn, mode, enabled=self.cfg.engine.fuse_loss_into_head,
                           chunk_tokens=self.cfg.engine.logprob_chunk_tokens)
        head_loss = ((lambda b: chunk_token_loss(loss_fn, b, token_weights(b, mode, ctx)))
                     if fused else None)
        self.model.train()
        loss_total = torch.zeros((), dtype=torch.float64, device=self.env.device)
        sums: dict[str, torch.Tensor] = {}
        tokens = 0
        for cpu_batch in micro_batches:
            batch, logp, entropy, shard, head_total = self._forward(
                cpu_batch, phase, with_entropy=with_entropy, head_loss=head_loss)
            mask = batch.to_sequences(batch.tensors["loss_mask"])
            seq_tensors = {k: batch.to_sequences(v) for k, v in batch.tensors.items()
                           if k not in ("input_ids", "labels", "position_ids")}
            # with the fused head the gradients are taken: the loss here is for its value
            with torch.set_grad_enabled(head_total is None):
                loss_mat, metrics = loss_fn(batch.to_sequences(logp), seq_tensors, mask)
                loss = aggregate_loss(loss_mat, mask, mode, ctx)
            if entropy is not None:
                metrics = {**metrics, "entropy": batch.to_sequences(entropy)}
            # Keeps the graph connected to the model even for an empty micro-batch, so every
            # rank runs the same FSDP2 collectives in backward (inside the plugins'
            # graft_compute: checkpointed blocks recompute as their forward ran).
            total = loss + 0.0 * logp.sum() if head_total is None else head_total
            self._compute(BACKWARD, phase,
                          lambda total=total, shard=shard: self._backward(total, shard))
            loss_total += loss.detach().double()
            tokens += sum(s.length for s in batch.layout.segments)
            for name, values in metrics.items():
                sums[name] = sums.get(name, 0.0) + (values.detach().double() * mask).sum()
        return PendingUpdate(loss_total, tokens, sums, ctx, self.env.dp_group)

    @staticmethod
    def _backward(total: torch.Tensor, shard: SequenceShard) -> None:
        if shard.split:
            # Inside the split: recomputed (checkpointed) blocks attend over whole rows.
            with sequence_split(shard):
                (total * backward_scale(shard)).backward()
        else:
            total.backward()

    def sequence_shard(self, batch: MicroBatch) -> SequenceShard:
        """The part of every row of ``batch`` this rank's forward computes (the whole rows
        without sequence parallelism)."""
        env = self.env
        return SequenceShard(env.sp_rank, env.sp_size, batch.layout.row_length, env.sp_group,
                             batch.tensors.get("position_ids"), batch.layout)

    def _forward(self, cpu_batch: MicroBatch, phase: Phase, *, with_entropy: bool = False,
                 head_loss: Callable[[MicroBatch], TokenLoss] | None = None,
                 ) -> tuple[MicroBatch, torch.Tensor, torch.Tensor | None, SequenceShard,
                            torch.Tensor | None]:
        """One micro-batch through the model between the plugins' forward hooks.

        Tensors a ``graft_post_forward`` plugin returns are kept in ``cpu_batch`` for the
        later passes over it. With sequence parallelism the forward runs on this rank's part
        of every row (`sequence_split`) and its outputs come back as whole rows. With
        ``head_loss`` (the `TokenLoss` of the batch on the device) and no split, the head
        takes the loss's gradient (`graft.engine.head.fused_loss`) and the last item is the
        loss to backpropagate; otherwise it is None.
        """
        hook = get_plugin_manager().hook
        batch = cpu_batch.to(self.env.device)
        shard = self.sequence_shard(batch)
        hook.graft_prepare_inputs(batch=batch.tensors, pad_size=batch.layout.pad_size,
                                  layout=batch.layout, cfg=self.cfg, phase=phase, shard=shard)
        if not shard.split:
            head_total = None
            if head_loss is None:
                logp, entropy = self._forward_logprobs(batch, with_entropy, phase)
            else:
                token_loss = head_loss(batch)
                logp, entropy, head_total = self._compute(FORWARD, phase, lambda: (
                    forward_fused_loss(self.model, self.family, batch, token_loss,
                                       compute_dtype=self.compute_dtype,
                                       with_entropy=with_entropy,
                                       chunk_tokens=self.cfg.engine.logprob_chunk_tokens,
                                       gradient=lambda run: self._compute(GRADIENT, phase, run))))
            kept = merge_kept(hook.graft_post_forward(batch=batch.tensors, layout=batch.layout,
                                                      phase=phase, cfg=self.cfg, shard=shard))
            cpu_batch.keep(kept)
            return batch, logp, entropy, shard, head_total
        part = MicroBatch(split_tensors(batch.tensors, shard), batch.layout,
                          batch.sequence_index, batch.sequence_valid)
        with sequence_split(shard):
            logp, entropy = self._forward_logprobs(part, with_entropy, phase)
        kept = merge_kept(hook.graft_post_forward(batch=part.tensors, layout=batch.layout,
                                                  phase=phase, cfg=self.cfg, shard=shard))
        cpu_batch.keep({name: shard.gather(tensor) for name, tensor in kept.items()})
        # Gathered once: from here on every output is a whole-row grid, unpadded as usual.
        logp = shard.gather(logp)
        entropy = None if entropy is None else shard.gather(entropy)
        return batch, logp, entropy, shard, None

    def _forward_logprobs(self, batch: MicroBatch, with_entropy: bool, phase: Phase
                          ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self._compute(FORWARD, phase, lambda: forward_logprobs(
            self.model, self.family, batch, compute_dtype=self.compute_dtype,
            with_entropy=with_entropy, chunk_tokens=self.cfg.engine.logprob_chunk_tokens))

    def _compute(self, step: str, phase: Phase, run: Callable[[], T]) -> T:
        """``run()``, the ``step`` of this engine's model, inside the plugins' graft_compute."""
        return compute(step, run, phase=phase, model=self.model, cfg=self.cfg)

    @torch.no_grad()
    def logprobs(self, micro_batches: Sequence[MicroBatch], *, phase: Phase) -> list[torch.Tensor]:
        """Label log-probabilities under the current weights, no grad: one CPU fp32 ``(R, L)``
        grid per micro-batch, laid out like its tensors (``layout.unpad`` gives per sample).

        ``phase`` (``old_logprobs``, ``ref_logprobs`` or ``rollout_logprobs``) is what the
        plugins' forward hooks are told. Pad positions hold the log-prob of the pad label, not
        0: mask them (``loss_mask``, or ``to_sequences``, which zeroes them) before use.
        """
        if phase in (UPDATE, SFT):
            raise ValueError(f"logprobs runs a no-grad phase, not {phase!r}")
        self.model.eval()
        out = []
        for cpu_batch in micro_batches:
            _, logp, *_ = self._forward(cpu_batch, phase)
            out.append(logp.cpu())  # one device-to-host copy per micro-batch (logp is fp32)
        return out

    def optimizer_step(self) -> torch.Tensor:
        """Clip gradients (``optim.max_grad_norm``; 0 = no clipping), step, schedule.

        Returns the gradient norm before clipping as a device tensor. A norm that is not finite
        (a NaN or inf in the loss or a gradient, on any rank: the norm is global) skips the
        update as if it had not been: the gradients are dropped, the weights, the optimizer's
        state and the learning-rate schedule stay as they were, `skipped_updates` counts it
        and rank 0 says so on the console.
        """
        max_norm = self.cfg.optim.max_grad_norm or float("inf")
        norm = clip_grad_norm(self.model.parameters(), max_norm, group=self.env.group)
        # Reading the norm waits for the backward: the optimizer must not see a NaN.
        if bool(torch.isfinite(norm)):
            self.optimizer.step()
            self.scheduler.step()
        else:
            self.skipped_updates += 1
            if self.env.is_main:
                self.say(f"update skipped: the gradient norm is {float(norm)} (a non-finite "
                         f"loss or gradient); the weights and the optimizer state are "
                         f"unchanged ({self.skipped_updates} skipped in this run so far)")
        self.optimizer.zero_grad(set_to_none=True)
        return norm
