"""The core's sequence-parallel seams, without any plugin: the sp dimension of `ParallelDims`
and its meshes, rows padded to a multiple of sp, `SequenceShard` cuts and gathers (with the
gradient going back to each rank's own part), the split-forward context, and the
``graft_parallel_dims`` hook that sizes sp."""

from __future__ import annotations

import os
import socket
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from graft import hookimpl
from graft.engine import SequenceShard, active_shard
from graft.engine.batch.micro_batch import TokenSample, build_micro_batch
from graft.engine.distributed.parallel_dims import ParallelDims
from graft.engine.distributed.sequence_parallel import (
    backward_scale,
    row_multiple,
    sequence_parallel_size,
    sequence_split,
    split_tensors,
)
from graft.errors import ConfigError, PluginError
from graft.plugins import GraftPluginManager


def test_sp_takes_ranks_from_data_parallelism() -> None:
    dims = ParallelDims(8, sp=2)
    assert (dims.dp, dims.sp, dims.efsdp, dims.sequence_parallel) == (4, 2, 8, True)
    assert ParallelDims(8).dp == 8


@pytest.mark.parametrize(("world", "sp", "ep", "says"), [
    (6, 4, 1, "divisor of the world size 6"), (4, 0, 1, "positive divisor"),
    (4, 2, 2, "not supported yet")])
def test_bad_sp_sizes_are_config_errors(world: int, sp: int, ep: int, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        ParallelDims(world, ep=ep, sp=sp)


def test_rows_are_padded_to_a_multiple_of_sp_and_of_the_bucket() -> None:
    assert row_multiple(None, 1) is None and row_multiple(12, 1) == 12
    assert row_multiple(None, 4) == 4 and row_multiple(6, 4) == 12
    samples = [TokenSample(list(range(3, 10)), 2), TokenSample(list(range(3, 9)), 3)]
    batch = build_micro_batch(samples, packs_sequences=True, pad_token_id=0,
                              pad_bucket=row_multiple(None, 4))
    assert batch.layout.row_length == 16 and batch.layout.pad_size == 3
    assert batch.tensors["loss_mask"][0, 13:].sum() == 0  # the sp pad is an ordinary pad


def test_a_shard_is_one_contiguous_part_of_every_row() -> None:
    grid = torch.arange(24).reshape(2, 12)
    shard = SequenceShard(rank=1, size=3, row_length=12)
    assert (shard.start, shard.stop, shard.length) == (4, 8, 4)
    assert torch.equal(shard.local(grid), grid[:, 4:8])
    parts = split_tensors({"a": grid, "b": grid[..., None]}, shard)
    assert parts["a"].shape == (2, 4) and parts["b"].shape == (2, 4, 1)
    assert backward_scale(shard) == 3.0


def test_without_sequence_parallelism_the_shard_is_the_whole_row() -> None:
    grid = torch.randn(2, 5, requires_grad=True)
    whole = SequenceShard(rank=0, size=1, row_length=5)
    assert whole.local(grid) is grid and whole.gather(grid) is grid and not whole.split


def test_active_shard_is_set_only_inside_a_split_forward() -> None:
    shard = SequenceShard(rank=0, size=2, row_length=4)
    assert active_shard() is None
    with sequence_split(shard):
        assert active_shard() is shard
    assert active_shard() is None
    with pytest.raises(RuntimeError), sequence_split(shard):
        raise RuntimeError
    assert active_shard() is None


class Sizes:
    def __init__(self, sizes: dict[str, int] | None) -> None:
        self.sizes = sizes

    @hookimpl
    def graft_parallel_dims(self, cfg: object) -> dict[str, int] | None:
        return self.sizes


def manager_with(*plugins: Sizes) -> GraftPluginManager:
    manager = GraftPluginManager()
    for index, plugin in enumerate(plugins):
        manager.register(plugin, f"sizes{index}")
    return manager


def test_hook_graft_parallel_dims_sizes_sp() -> None:
    cfg = SimpleNamespace()
    assert sequence_parallel_size(cfg=cfg, manager=manager_with()) == 1
    assert sequence_parallel_size(cfg=cfg, manager=manager_with(Sizes(None), Sizes({"sp": 4}))) == 4
    assert sequence_parallel_size(cfg=cfg, manager=manager_with(Sizes({"sp": 1}), Sizes({"sp": 2}))) == 2
    with pytest.raises(PluginError, match="both set the sp size"):
        sequence_parallel_size(cfg=cfg, manager=manager_with(Sizes({"sp": 2}), Sizes({"sp": 2})))
    with pytest.raises(PluginError, match="sizes 'tp'"):
        sequence_parallel_size(cfg=cfg, manager=manager_with(Sizes({"tp": 2})))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_ranks(rank: int, port: int) -> None:
    """One rank's checks; an exception reaches the parent through the spawn context."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    _check_meshes_and_gather(rank)
    dist.barrier()  # neither rank tears down its sockets while the other still reads
    dist.destroy_process_group()
    # As graft.engine.distributed.env.end_torchrun_worker: gloo's threads can abort a process
    # while C++ statics are destroyed ("terminate called without an active exception", a
    # SIGABRT that failed this test in CI), so a rank that passed leaves without that teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _check_meshes_and_gather(rank: int) -> None:
    meshes = ParallelDims(2, sp=2).build_meshes("cpu")
    assert meshes["shard"].size() == 2 and meshes["dp"].size() == 1
    assert meshes["sp"].get_local_rank() == rank and meshes["efsdp"].size() == 2
    full = torch.arange(2 * 6 * 3, dtype=torch.float32).reshape(2, 6, 3)
    shard = SequenceShard(rank, 2, 6, meshes["sp"].get_group())
    part = shard.local(full).clone().requires_grad_(True)
    gathered = shard.gather(part)
    assert torch.equal(gathered, full)
    weights = torch.arange(full.numel(), dtype=torch.float32).reshape(full.shape)
    (gathered * weights).sum().backward()  # every rank computes the same loss on whole rows
    assert torch.equal(part.grad, shard.local(weights))  # ... and keeps its own part's gradient
    routes = shard.local(torch.arange(24, dtype=torch.int16).reshape(2, 6, 2))
    assert torch.equal(shard.gather(routes), torch.arange(24, dtype=torch.int16).reshape(2, 6, 2))
    flags = shard.local(torch.tensor([[True, False, True, True, False, False]]))
    assert shard.gather(flags).tolist() == [[True, False, True, True, False, False]]


def test_two_ranks_split_rows_gather_them_and_send_gradients_home() -> None:
    mp.start_processes(_two_ranks, args=(_free_port(),), nprocs=2, start_method="spawn")
