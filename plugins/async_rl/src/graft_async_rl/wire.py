"""What travels between the trainers and the rollout workers, over torch.distributed.

Objects (a worker's samples, the start message) travel pickled in a uint8 tensor after its
length; weights travel bucket by bucket (`stream_weights`) in a broadcast from trainer rank 0
to the workers, each bucket's names, dtypes and shapes first. Every wait has a time limit,
past which the run stops with a `graft.errors.PluginError` naming who did not answer.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from graft.errors import PluginError

DTYPES = {str(dtype): dtype for dtype in (torch.float32, torch.bfloat16, torch.float16,
                                          torch.float64, torch.int64, torch.int32, torch.uint8,
                                          torch.bool)}


def _wait(work: Any, timeout_s: float, waiting_for: str) -> None:
    try:
        work.wait(timeout=timedelta(seconds=timeout_s))
    except RuntimeError as error:
        raise PluginError(f"graft-async-rl: no answer from {waiting_for} within "
                          f"features.async_rl.worker_timeout_s={timeout_s:g} s ({error}); it "
                          f"may have died (its log says why) or need more time (raise the "
                          f"setting)") from None


def _encode(value: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    payload = torch.frombuffer(bytearray(pickle.dumps(value)), dtype=torch.uint8)
    return torch.tensor([payload.numel()], dtype=torch.int64, device=device), payload.to(device)


def _decode(payload: torch.Tensor) -> Any:
    return pickle.loads(payload.cpu().numpy().tobytes())


@dataclass
class PendingSends:
    """Objects sent without waiting (`send_object`): their buffers stay referenced until
    `wait_all` (a worker sends ahead while it waits for weights)."""

    works: list[tuple[Any, tuple[torch.Tensor, ...]]] = field(default_factory=list)

    def wait_all(self, timeout_s: float, waiting_for: str) -> None:
        """Wait until every send so far was received."""
        for work, _ in self.works:
            _wait(work, timeout_s, waiting_for)
        self.works.clear()


def send_object(value: Any, dst: int, device: torch.device, pending: PendingSends) -> None:
    """Send ``value`` to global rank ``dst`` without waiting (`recv_object` takes it)."""
    size, payload = _encode(value, device)
    pending.works.append((dist.isend(size, dst), (size,)))
    pending.works.append((dist.isend(payload, dst), (payload,)))


def recv_object(src: int, device: torch.device, timeout_s: float, waiting_for: str) -> Any:
    """The next object global rank ``src`` sent with `send_object`."""
    size = torch.zeros(1, dtype=torch.int64, device=device)
    _wait(dist.irecv(size, src), timeout_s, waiting_for)
    payload = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    _wait(dist.irecv(payload, src), timeout_s, waiting_for)
    return _decode(payload)


def broadcast_object(value: Any, group: dist.ProcessGroup, device: torch.device,
                     timeout_s: float, waiting_for: str) -> Any:
    """Trainer rank 0's ``value`` on every rank of ``group`` (0 and the workers)."""
    source = dist.get_global_rank(group, 0)
    if dist.get_rank() == source:
        size, payload = _encode(value, device)
    else:
        size = torch.zeros(1, dtype=torch.int64, device=device)
    _wait(dist.broadcast(size, source, group=group, async_op=True), timeout_s, waiting_for)
    if dist.get_rank() != source:
        payload = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    _wait(dist.broadcast(payload, source, group=group, async_op=True), timeout_s, waiting_for)
    return value if dist.get_rank() == source else _decode(payload)


def stream_weights(model: torch.nn.Module, sink: BroadcastSink | None, *,
                   bucket_bytes: int, frozen: bool = True) -> None:
    """Every tensor of the (sharded) ``model``'s state dict, whole, under its module name, to
    ``sink`` (trainer rank 0's; None on the other trainers, which help gather) in buckets of
    about ``bucket_bytes``. Called on every trainer: gathering a shard is a collective. The
    model's own names and layout, not a Hugging Face export's: the workers' copy is the same
    module. ``frozen`` False leaves out the parameters that do not train (a frozen base under
    graft-lora's adapters: only the adapters and the buffers go)."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    if sink is not None:
        sink.begin()
    for name, value in model.state_dict(keep_vars=True).items():
        if not frozen and isinstance(value, torch.nn.Parameter) and not value.requires_grad:
            continue
        value = value.detach()
        full = value.full_tensor() if hasattr(value, "full_tensor") else value
        if sink is None:
            continue
        bucket.append((name, full.detach()))
        size += full.numel() * full.element_size()
        if size >= bucket_bytes:
            sink.consume(bucket)
            bucket, size = [], 0
    if sink is not None:
        if bucket:
            sink.consume(bucket)
        sink.finish()


class BroadcastSink:
    """A weight sink (`graft.export.WeightSink`'s methods) on trainer rank 0: each bucket of
    full tensors goes to the workers of ``group`` as its table (names, dtypes, shapes) and one
    flat byte tensor; a version starts with its number and ends with an empty table."""

    def __init__(self, group: dist.ProcessGroup, device: torch.device, timeout_s: float) -> None:
        self.group, self.device, self.timeout_s = group, device, timeout_s
        self.version = 0
        self.bytes = 0

    def _send(self, value: Any) -> None:
        broadcast_object(value, self.group, self.device, self.timeout_s, "the rollout workers")

    def begin(self) -> None:
        """Tag the export with its version."""
        self.bytes = 0
        self._send({"version": self.version})

    def consume(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        """One bucket: its table, then its bytes."""
        self._send([(name, str(t.dtype), tuple(t.shape)) for name, t in tensors])
        flat = torch.cat([t.detach().contiguous().view(-1).view(torch.uint8) for _, t in tensors])
        flat = flat.to(self.device)
        _wait(dist.broadcast(flat, dist.get_global_rank(self.group, 0), group=self.group,
                             async_op=True), self.timeout_s, "the rollout workers")
        self.bytes += flat.numel()

    def finish(self) -> None:
        """The end of this version."""
        self._send([])

    def abort(self, error: BaseException) -> None:
        """Nothing to undo here: the run stops with ``error``."""


def receive_weights(model: torch.nn.Module, group: dist.ProcessGroup, device: torch.device,
                    timeout_s: float) -> int:
    """Apply one version of the trainers' weights (`BroadcastSink`) to ``model`` (a rollout
    worker's unsharded copy) in place; returns the version."""
    waiting = "the trainers' weights (trainer rank 0)"
    version = broadcast_object(None, group, device, timeout_s, waiting)["version"]
    params = {name: value for name, value in model.state_dict().items()}
    while table := broadcast_object(None, group, device, timeout_s, waiting):
        sizes = [torch.Size(shape).numel() * DTYPES[dtype].itemsize for _, dtype, shape in table]
        flat = torch.empty(sum(sizes), dtype=torch.uint8, device=device)
        _wait(dist.broadcast(flat, dist.get_global_rank(group, 0), group=group, async_op=True),
              timeout_s, waiting)
        for (name, dtype, shape), piece in zip(table, flat.split(sizes), strict=True):
            _local(params, name).copy_(piece.view(DTYPES[dtype]).view(shape))
    return version


def _local(params: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """The worker's tensor of the exported ``name`` (its local shard: the whole tensor on a
    worker's own one-rank mesh)."""
    if name not in params:
        raise PluginError(f"graft-async-rl: the trainers sent {name!r}, which the rollout "
                          f"worker's model does not have: the two built different models "
                          f"(a plugin that changes the model on some ranks only?)")
    value = params[name]
    return value.to_local() if hasattr(value, "to_local") else value
