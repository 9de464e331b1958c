"""The pack/unpack state machine on the CPU stand-in for the device (copies run late, memory
handed out uninitialised is NaN): results bit-identical to no offload, memory let go, state reset."""

from __future__ import annotations

import gc
import logging
import weakref

import pytest
import torch

from graft_offload.entry import State
from graft_offload.offloader import PassRecord, ineligible_reason
from graft_offload.standin import DeferredCopyBackend, StandInRace
from graft_offload.stats import LAST_BLOCK


class NoComputeWaits(DeferredCopyBackend):
    """A broken ordering: the compute stream never waits for a copy."""

    def wait_event(self, stream, event) -> None:
        if stream is not self.compute:
            super().wait_event(stream, event)


class LoggedFetches(DeferredCopyBackend):
    """Logs every device allocation: the offload allocates one per input it brings back."""

    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log

    def empty(self, shape, dtype, device):
        self.log.append("fetch")
        return super().empty(shape, dtype, device)


def stack_steps(stack, steps: int = 2, offloader=None, backend=None) -> list[torch.Tensor]:
    """Loss and input-to-output gradients of ``steps`` forward/backward passes of a `Stack`."""
    generator = torch.Generator().manual_seed(3)
    results = []
    for _ in range(steps):
        if offloader is not None:
            offloader.begin_step()
        x = torch.randn(8, 16, generator=generator, requires_grad=True)  # as embeddings are
        loss = stack(x).square().mean()
        loss.backward()
        if backend is not None:
            backend.synchronize()
        results += [loss.detach(), *(p.grad.clone() for p in stack.parameters())]
        stack.zero_grad()
    return results


def seeded_stack(build_stack, **kwargs):
    torch.manual_seed(0)
    return build_stack(**kwargs)


def test_losses_and_gradients_are_bit_identical_over_three_steps_with_buffer_reuse(
        build_llama, train_llama, offload, identical) -> None:
    expected = train_llama(build_llama())
    model, backend = build_llama(), DeferredCopyBackend()
    offloader = offload(model.model.layers, backend)
    got = train_llama(model, offloader=offloader, backend=backend)
    identical(expected, got)
    assert got.host_allocations == [3, 3, 3]  # blocks 0-2 (block 3 is last), allocated once
    for metrics in got.metrics:
        assert metrics["offload/host_gb"] == metrics["offload/offloaded_gb"] > 0
        assert metrics["offload/kept_on_gpu_blocks"] == 0


def test_checkpoint_groups_offload_their_inputs_and_each_replayed_blocks(
        build_llama, train_llama, offload, identical) -> None:
    """Checkpoints of two blocks (`graft.engine.checkpoint_groups`): each group's input leaves
    the device in forward, and in each group's backward the inputs of its replayed blocks do
    (but the last block's); losses and gradients bit-identical to the same groups without
    offload, and nothing the blocks save is left on the device but their inputs."""
    expected = train_llama(build_llama(every_blocks=2))
    model, backend = build_llama(every_blocks=2), DeferredCopyBackend()
    offloader = offload(model.model.layers, backend)
    got = train_llama(model, offloader=offloader, backend=backend)
    identical(expected, got)
    for metrics in got.metrics:
        # forward: the inputs of groups 0-1 and 2-3; replays: blocks 2 (3 is last), 1 and 0
        assert metrics["offload/offloaded_inputs"] == 2 + 1 + 2
        assert metrics["offload/other_saved_gb"] == 0
        assert metrics["offload/kept_on_gpu_blocks"] == metrics["offload/kept_on_gpu_gb"] == 0


def test_the_last_input_of_a_replay_is_let_go_with_its_backward(build_llama, offload) -> None:
    """A checkpoint group's replay ends with a block whose input is restored before any other
    block starts: once its backward is done, nothing holds it (the offload used to, until the
    next pass began)."""
    model = build_llama(every_blocks=2)
    offloader = offload(model.model.layers, DeferredCopyBackend())
    replayed: list[weakref.ref] = []
    model.model.layers[1].register_forward_pre_hook(
        lambda _, args: replayed.append(weakref.ref(args[0])) if torch.is_grad_enabled() else None)
    offloader.begin_step()
    ids = torch.arange(48).view(2, 24)
    model(input_ids=ids, labels=ids).loss.backward()
    gc.collect()
    assert len(replayed) == 2 and replayed[-1]() is None  # forward, then group 0-1's replay
    offloader.end_step()


def test_a_compute_stream_that_never_waits_for_copies_is_caught(build_llama, train_llama,
                                                                offload) -> None:
    model, backend = build_llama(), NoComputeWaits()
    with pytest.raises(StandInRace, match="reads a host buffer before the copy that writes it"):
        train_llama(model, steps=1, offloader=offload(model.model.layers, backend),
                    backend=backend)


def test_offloaded_inputs_leave_the_device_after_forward(build_llama, offload) -> None:
    def inputs_alive_after_forward(model) -> list[bool]:
        refs = []
        for layer in model.model.layers:
            layer.register_forward_pre_hook(lambda _, args: refs.append(weakref.ref(args[0])))
        ids = torch.arange(48).view(2, 24)
        loss = model(input_ids=ids, labels=ids).loss
        gc.collect()
        alive = [ref() is not None for ref in refs]
        loss.backward()
        return alive

    assert inputs_alive_after_forward(build_llama()) == [True] * 4
    model = build_llama()
    offload(model.model.layers, DeferredCopyBackend())
    assert inputs_alive_after_forward(model) == [False, False, False, True]


def test_passes_without_gradients_do_nothing(build_llama, offload) -> None:
    model, backend = build_llama(), DeferredCopyBackend()
    offloader = offload(model.model.layers, backend)
    ids = torch.arange(48).view(2, 24)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert offloader.stats.offloaded_bytes == 0 and offloader.pool.allocations == 0
    with torch.no_grad():
        assert torch.equal(build_llama()(input_ids=ids).logits, logits)


def test_the_last_block_is_never_offloaded(build_stack, offload) -> None:
    stack, backend = seeded_stack(build_stack), DeferredCopyBackend()
    offloader = offload(stack.layers, backend)
    stack_steps(stack, steps=1, offloader=offloader, backend=backend)
    assert offloader.stats.kept == {3: LAST_BLOCK}
    assert offloader.stats.offloaded_bytes == offloader.stats.fetched_bytes == 3 * 8 * 16 * 4


def test_keyword_inputs_are_reported_and_kept(build_stack, offload,
                                              caplog: pytest.LogCaptureFixture) -> None:
    expected = stack_steps(seeded_stack(build_stack, keyword=True))
    stack, backend = seeded_stack(build_stack, keyword=True), DeferredCopyBackend()
    offloader = offload(stack.layers, backend)
    with caplog.at_level(logging.WARNING, logger="graft.offload"):
        got = stack_steps(stack, offloader=offloader, backend=backend)
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
    warnings = [r.getMessage() for r in caplog.records if "keyword argument" in r.getMessage()]
    assert len(warnings) == 4  # once per block, not once per call
    assert "model.layers.0 received 'hidden_states' as keyword argument(s)" in warnings[0]
    assert offloader.end_step()["offload/kept_on_gpu_blocks"] == 3
    assert offloader.stats.offloaded_bytes == 0


def test_the_host_ceiling_keeps_later_blocks_on_the_device_and_says_which(
        build_stack, offload, caplog: pytest.LogCaptureFixture) -> None:
    expected = stack_steps(seeded_stack(build_stack, blocks=5))
    stack, backend = seeded_stack(build_stack, blocks=5), DeferredCopyBackend()
    offloader = offload(stack.layers, backend, host_cache_limit_bytes=2 * 8 * 16 * 4)
    with caplog.at_level(logging.WARNING, logger="graft.offload"):
        got = stack_steps(stack, offloader=offloader, backend=backend)
        metrics = offloader.end_step()
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
    assert metrics["offload/kept_on_gpu_blocks"] == 2
    assert metrics["offload/kept_on_gpu_gb"] * 2**30 == 2 * 8 * 16 * 4  # blocks 2 and 3
    assert metrics["offload/offloaded_inputs"] == 2
    assert offloader.pool.held_bytes == 2 * 8 * 16 * 4 == metrics["offload/host_gb"] * 2**30
    assert ("model.layers.2..model.layers.3 (2 blocks): host_cache_limit_gb reached"
            in caplog.text)


@pytest.mark.parametrize(("prefetch", "expected"), [
    (1, ["backward 3", "fetch", "backward 2", "fetch", "backward 1", "fetch", "backward 0"]),
    (2, ["backward 3", "fetch", "fetch", "backward 2", "fetch", "backward 1", "backward 0"]),
])
def test_inputs_come_back_ahead_of_their_blocks_backward(build_stack, offload, prefetch: int,
                                                         expected: list[str]) -> None:
    log: list[str] = []
    stack, backend = seeded_stack(build_stack), LoggedFetches(log)
    stack.output_hooks.append(lambda block: log.append(f"backward {block}"))
    offload(stack.layers, backend, prefetch_blocks=prefetch)
    stack(torch.randn(8, 16)).sum().backward()
    assert log == expected


def test_an_exception_in_a_block_resets_the_state_and_returns_the_buffers(build_stack,
                                                                          offload) -> None:
    expected = stack_steps(seeded_stack(build_stack))
    stack, backend = seeded_stack(build_stack), DeferredCopyBackend()
    offloader = offload(stack.layers, backend)

    def fail(module, args) -> None:
        raise RuntimeError("block 2")

    # Inside block 2's forward, after checkpointing saved its input (transformers < 5.23
    # checkpoints in the layer's __call__, later versions in its forward).
    failing = stack.layers[2].linear.register_forward_pre_hook(fail)
    with pytest.raises(RuntimeError, match="block 2"):
        stack(torch.randn(8, 16))
    gc.collect()
    # Blocks 0-2 had saved their inputs (checkpointing saves them before running the block).
    assert offloader.pool.idle_bytes == offloader.pool.held_bytes == 3 * 8 * 16 * 4
    failing.remove()
    got = stack_steps(stack, offloader=offloader, backend=backend)
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
    assert offloader.pool.allocations == 3  # the failed pass's buffers were reused


def test_a_failed_backward_leaves_no_copy_writing_into_reusable_memory(build_stack,
                                                                       offload) -> None:
    stack, backend = seeded_stack(build_stack), DeferredCopyBackend()
    offloader = offload(stack.layers, backend)

    def fail(block: int) -> None:
        if block == 2:  # after block 3's backward brought block 2's input back ahead of time
            raise RuntimeError("backward of block 2")

    stack.output_hooks.append(fail)
    with pytest.raises(RuntimeError, match="backward of block 2"):
        stack(torch.randn(8, 16, requires_grad=True)).sum().backward()
    gc.collect()
    copies_in = offloader.transfers.h2d_stream
    assert copies_in.done < len(copies_in.work)  # block 2's copy back is still queued
    offloader.begin_step()
    assert copies_in.done == len(copies_in.work)  # the compute stream waited for it
    assert offloader.pool.idle_bytes == offloader.pool.held_bytes == 3 * 8 * 16 * 4


def test_a_buffer_given_back_during_its_copy_back_is_rewritten_only_after_it(build_stack,
                                                                             offload) -> None:
    """A graph dropped while a prefetched copy back still reads its buffer (a failed backward
    whose graph the garbage collector frees at any moment, say inside the next block's pack
    hook): the next copy out into that buffer waits for the copy back."""
    stack, backend = seeded_stack(build_stack), DeferredCopyBackend()
    offloader = offload(stack.layers, backend)

    def fail(block: int) -> None:
        if block == 2:  # after block 3's backward brought block 2's input back ahead of time
            raise RuntimeError("backward of block 2")

    stack.output_hooks.append(fail)
    with pytest.raises(RuntimeError, match="backward of block 2"):
        stack(torch.randn(8, 16, requires_grad=True)).sum().backward()
    gc.collect()  # block 2's copy back is orphaned, its buffer back in the pool
    assert offloader.transfers.h2d_stream.done < len(offloader.transfers.h2d_stream.work)
    inputs, record = [torch.randn(8, 16) for _ in range(3)], PassRecord()
    entries = [offloader.save_input(block, tensor, None, record)  # one of them gets its buffer
               for block, tensor in enumerate(inputs)]
    offloader.release_copied()
    assert [entry.state for entry in entries] == [State.ON_HOST] * 3
    for entry, tensor in zip(entries, inputs, strict=True):
        assert torch.equal(entry.restore(offloader.transfers, offloader.pool), tensor)


def compiled(model: torch.nn.Module) -> torch.nn.Module:
    for layer in model.model.layers:
        layer.compile(backend="aot_eager")
    return model


@pytest.mark.parametrize("compile_blocks", [False, True], ids=["eager", "compiled"])
def test_blocks_keep_nothing_but_their_inputs_and_parameters(build_llama, train_llama, offload,
                                                             identical, compile_blocks) -> None:
    """Eager and compiled, on either side of transformers 5.23 (which moved checkpointing from
    the layer's __call__ into its forward, so that it runs inside a compiled block): bit-identical,
    every input but the last offloaded, and what else the blocks save is small (the RoPE
    tables; the RNG state)."""
    def build():
        return compiled(build_llama()) if compile_blocks else build_llama()

    torch._dynamo.reset()
    expected = train_llama(build(), steps=2, tokens=256)
    model, backend = build(), DeferredCopyBackend()
    got = train_llama(model, steps=2, offloader=offload(model.model.layers, backend),
                      backend=backend, tokens=256)
    identical(expected, got)
    block_input = 2 * 256 * 64 * 4
    for metrics in got.metrics:
        assert metrics["offload/offloaded_gb"] * 2**30 == 3 * block_input
        assert metrics["offload/other_saved_gb"] * 2**30 < block_input


def test_blocks_without_checkpointing_show_what_they_keep(build_llama, offload) -> None:
    model = build_llama()
    for layer in model.model.layers:
        layer.gradient_checkpointing = False  # every block then saves its activations
    offloader = offload(model.model.layers, DeferredCopyBackend())
    ids = torch.arange(512).view(2, 256) % 100
    model(input_ids=ids, labels=ids).loss.backward()
    metrics = offloader.end_step()
    assert metrics["offload/other_saved_gb"] > 10 * metrics["offload/offloaded_gb"] > 0


def test_timing_adds_copy_rates_and_exposed_time(build_stack, offload) -> None:
    stack, backend = seeded_stack(build_stack), DeferredCopyBackend()
    offloader = offload(stack.layers, backend, timing=True)
    stack_steps(stack, steps=1, offloader=offloader, backend=backend)
    assert {"offload/d2h_gbps", "offload/h2d_gbps", "offload/exposed_copy_ms"} <= set(
        offloader.end_step())


def test_what_is_never_offloaded() -> None:
    backend, base = DeferredCopyBackend(), torch.zeros(4, 8)

    def reason(tensor, min_bytes: int = 0):
        return ineligible_reason(tensor, backend, min_bytes)

    host = backend.allocate_host(64)[0].view(torch.float32)
    assert reason(torch.zeros(4, 8)) is None
    assert reason(host) == "not on the device"
    assert reason(torch.nn.Parameter(torch.zeros(4, 8))) == "a parameter"
    assert reason(base[1:]) == "a view of another tensor"
    assert reason(torch.empty_strided((4, 8), (1, 4))) == "not contiguous"
    assert reason(torch.zeros(8).set_(torch.zeros(16).untyped_storage(), 0, (8,))) == \
        "shares its storage with other tensors"
    assert reason(torch.zeros(4, 8), min_bytes=129) == "smaller than min_tensor_mb"
