"""`GraphedDecoder`: Graft's own sampling loop over a static KV cache, its decode step replayed
from a CUDA graph.

transformers' ``generate`` pays for every token on the host: logits processors, stopping checks
that wait for the device, a Python forward that launches every kernel again. Compiling that
step with inductor as transformers does removes the launches but fuses kernels that keep fp32
where the trainer's eager forward rounds to bf16 (the train-inference mismatch grows). This loop
captures the decode step once per (batch, cache length, attended length) in a CUDA graph and
replays it, so each token costs one graph launch plus a few sampling kernels, with the trainer's
numerics.

A graph still runs every kernel the step launches: eagerly, a Llama layer is some forty (each
RMSNorm six, rotary a dozen), and at small batches their launches, not the weights, set a step's
time. With ``fuse_kernels`` each decoder block's decode step is compiled by inductor first, one
graph for every block (`graft_graphed_decode.regional_compile`: compiling the step whole took
minutes), with ``emulate_precision_casts``: a fused kernel rounds to the compute dtype wherever
the eager ops would have, so the elementwise chains become a few kernels without changing their
rounding; the GEMMs and the attention stay the eager (aten) kernels. Reductions inside fused
kernels (the RMSNorm mean) may still sum in another order.

The step's inputs live in fixed tensors the graph reads (the last tokens, their positions, which
cache slots hold keys); the model gets an explicit 4-D mask built from them inside the graph, so
transformers does no data-dependent mask work. Prompts are left-padded and share one cache index
per step; a padded query position attends to itself only (never to nothing, which would put
NaNs in the cache). Sampling (temperature, top-p, multinomial; with ``rollout.seeded_sampling``
the core's draw keyed by each row's seed, `graft.rollout.seeded_scores`) and the log-probs (the
trainer's own `token_logprobs`) run on the device; the host looks at the finished flags every
``check_every`` steps to stop early. Without CUDA (tests) the same step runs eagerly.

As rows finish, the loop moves the unfinished ones into a smaller batch (steps of about an eighth
of the first, each with its graphs, its cache the first rows of the full batch's) so that
finished rows stop costing compute. With SDPA, a decode step attends with grouped queries (the
query heads of a key/value head as one query block,
`graft_graphed_decode.decode_attention`) instead of copying every cached key and value once per
query head, as transformers' SDPA path does when a mask is given; and only to the cache slots
filled so far, rounded up (one graph per such length, `_attended_lengths`), not to the empty end
of the cache: at large batches the attention was the largest single cost of a step
(bench/README.md).

Only for models whose attention is full and causal over one static cache (``layer_types`` all
``full_attention``, no sliding window): others keep transformers' path
(`decodes_with_graphs`). A model with transformers' eager MoE experts runs the same loop without
graphs (`graft_graphed_decode.capturable`).

Memory: the cache of one cache length (``batch x length`` keys and values per layer; the
smaller batches' caches are views of its first rows) and the graphs (one memory pool) stay
allocated between rollouts, through the update, so the next rollout replays without capturing
again; a rollout of another length lets them go, and their memory pool.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from graft.engine import DECODE, PREFILL, ROLLOUT, SAMPLE_LOGPROBS, compute, token_logprobs
from graft.models import cache_keyword
from graft.rollout import SamplingSpec, seeded_scores, token_keys
from graft_graphed_decode.capturable import host_synchronising_experts
from graft_graphed_decode.decode_attention import takes_boolean_mask, use_grouped_query_attention
from graft_graphed_decode.regional_compile import compile_decoder_blocks, compiled_blocks

T = TypeVar("T")
CACHE_LENGTH_MULTIPLE = 64  # cache lengths round up to this, so nearby prompt lengths share a graph
ATTENDED_LENGTHS = 8  # at most this many attended lengths (graphs) per batch size
BATCH_SIZE_STEPS = 8  # a batch shrinks in steps of about 1/8 of where it started
# a prepared cache up to this many times longer than a rollout needs serves it (memory bound)
REUSED_CACHE_SLACK = 2


def decodes_with_graphs(model: torch.nn.Module) -> bool:
    """Whether `GraphedDecoder` can run ``model``: transformers compiles it whole (static cache)
    and every layer attends to the whole causal context."""
    config = model.config
    if not getattr(model, "_can_compile_fullgraph", False):
        return False
    # this loop hands the attention a ready 4-D mask: a boolean one (`takes_boolean_mask`)
    # or, to eager attention, an additive one; flash attention takes none
    attention = getattr(config, "_attn_implementation", None)
    if attention != "eager" and not takes_boolean_mask(attention):
        return False
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return all(kind == "full_attention" for kind in layer_types)
    return getattr(config, "sliding_window", None) is None or \
        getattr(config, "use_sliding_window", True) is False


@dataclass
class _DecodeState:
    """The fixed tensors one captured step reads and writes, and its cache."""

    cache: object
    tokens: torch.Tensor  # (batch, 1) the last sampled tokens
    positions: torch.Tensor  # (batch, 1) their rotary positions
    slot: torch.Tensor  # (1,) the cache index this step writes
    key_valid: torch.Tensor  # (batch, cache length) bool: which cache slots hold real keys
    # per attended length (`GraphedDecoder._attended_lengths`): the captured step, its output
    graphs: dict[int, torch.cuda.CUDAGraph] = field(default_factory=dict)
    logits: dict[int, torch.Tensor] = field(default_factory=dict)  # (batch, vocab)


class GraphedDecoder:
    """Samples continuations of left-padded prompts from ``model`` (an unsharded inference copy)."""

    def __init__(self, model: torch.nn.Module, *, pad_token_id: int, eos_token_id: int | None,
                 use_graphs: bool, fuse_kernels: bool = False, check_every: int = 16,
                 min_batch: int = 8,
                 decoder_blocks: Sequence[torch.nn.Module] | None = None,
                 cfg: Any = None) -> None:
        self.model = model
        self.pad_token_id = pad_token_id
        self.eos_token_id = eos_token_id
        # eager MoE experts find their tokens on the host: their step cannot be captured
        self.use_graphs = use_graphs and not host_synchronising_experts(model)
        self.check_every = check_every
        self.min_batch = min_batch
        # (a model another decoder switched to the grouped-query attention takes it as well)
        self.boolean_mask = takes_boolean_mask(model.config._attn_implementation)
        self._cache_keyword = cache_keyword(model)  # ``cache`` from transformers 5.24 on
        # every prefill, step and log-prob inside the plugins' graft_compute (cfg: the root
        # config they read, None outside a run)
        self.cfg = cfg
        if model.config._attn_implementation == "sdpa":
            use_grouped_query_attention(model)
        # One cache slot past the last attended length, never attended: the attended keys are
        # then never the whole cache, whose contiguous view would be another compiled graph
        # (`fuse_kernels`) than the shorter, strided ones.
        self._spare_cache_slots = 1 if self.boolean_mask else 0
        self.batch_sizes: list[int] = []  # the batch sizes the last `generate` decoded at
        self.fuse_kernels = fuse_kernels
        if self.fuse_kernels:  # compiled on the first step (the first graph's warm-up on GPU)
            # by default a standard *ForCausalLM's blocks, ``model.model.layers``
            compile_decoder_blocks(decoder_blocks or list(model.get_decoder().layers),
                                   options={"emulate_precision_casts": True})
        self._states: dict[tuple[int, int], _DecodeState] = {}
        self._graph_pool = None  # one memory pool for all graphs: they never run at once
        self._token_keys: torch.Tensor | None = None  # seeded sampling's, once per vocabulary

    @torch.no_grad()
    def generate(self, ids: torch.Tensor, mask: torch.Tensor,
                 spec: SamplingSpec) -> tuple[torch.Tensor, torch.Tensor]:
        """``(new tokens, their log-probs)``, both ``(batch, steps)``: ``ids`` and ``mask`` are
        left-padded prompts ``(batch, prompt length)``. A row that emitted EOS is padded after it
        (log-prob 0); generation stops when every row has or after ``spec.max_new_tokens``."""
        batch, prompt_length = ids.shape
        if spec.max_new_tokens < 1:
            empty = torch.empty((batch, 0), device=ids.device)
            return empty.long(), empty
        length = self._cache_length(prompt_length + spec.max_new_tokens)
        state = self._state(batch, length, ids.device)
        # Prepared now, never in the middle of a rollout: a new state's capture runs steps
        # that write the cache rows it shares with the larger batches.
        smaller_batches = self._smaller_batches(batch)
        for size in smaller_batches:
            self._state(size, length, ids.device)
        attended_lengths = self._attended_lengths(state.key_valid.shape[1])
        rows = torch.arange(batch, device=ids.device)  # the original row of each state row
        finished = torch.zeros(batch, dtype=torch.bool, device=ids.device)
        tokens = torch.full((batch, spec.max_new_tokens), self.pad_token_id, dtype=torch.long,
                            device=ids.device)
        logprobs = torch.zeros((batch, spec.max_new_tokens), device=ids.device)
        self.batch_sizes = [batch]
        logits = self._prefill(state, ids, mask)
        seeds = (None if spec.seeds is None
                 else torch.tensor(spec.seeds, dtype=torch.int64, device=ids.device))
        for step in range(spec.max_new_tokens):
            token, logprob = self._sample(logits, spec, finished,
                                          None if seeds is None else (seeds[rows], step))
            tokens[rows, step] = token
            logprobs[rows, step] = logprob
            if step + 1 == spec.max_new_tokens:
                break
            if (step + 1) % self.check_every == 0:
                remaining = int((~finished).sum())
                if remaining == 0:
                    break
                keep = _rows_to_keep(finished, remaining, smaller_batches)
                if keep is not None:
                    state = self._compact(state, keep)
                    rows, finished, token = rows[keep], finished[keep], token[keep]
                    self.batch_sizes.append(len(keep))
            state.tokens.copy_(token[:, None])
            # this step writes cache slot prompt_length + step and attends to every slot up to it
            attended = next(n for n in attended_lengths if n > prompt_length + step)
            logits = self._decode(state, attended)
        return tokens[:, :step + 1], logprobs[:, :step + 1]

    def _cache_length(self, needed: int) -> int:
        """The cache length a rollout of ``needed`` tokens a row decodes in: that of the states
        already prepared when it is long enough and at most `REUSED_CACHE_SLACK` times what is
        needed, else ``needed`` rounded up. A validation's rollout, or a step whose prompts are
        a little shorter, then replays the training's graphs rather than letting them go (and
        the next step capturing and compiling them again)."""
        needed = _round_up(needed, CACHE_LENGTH_MULTIPLE)
        prepared = max((length for _, length in self._states), default=0)
        return prepared if needed <= prepared <= REUSED_CACHE_SLACK * needed else needed

    def _attended_lengths(self, cache_length: int) -> list[int]:
        """The key lengths a decode step over a ``cache_length`` cache attends to, one graph
        each: with the grouped-query attention (which attends to the keys its mask covers) up to
        `ATTENDED_LENGTHS` steps of a multiple of `CACHE_LENGTH_MULTIPLE`, so early steps do not
        read the empty end of the cache; the whole cache with the model's own attention."""
        if not self.boolean_mask:
            return [cache_length]
        step = _round_up(-(-cache_length // ATTENDED_LENGTHS), CACHE_LENGTH_MULTIPLE)
        return [*range(step, cache_length, step), cache_length]

    def _smaller_batches(self, batch: int) -> list[int]:
        """The batch sizes rows of a ``batch`` can move to as they finish (`_rows_to_keep`):
        multiples of about ``batch / BATCH_SIZE_STEPS``, and powers of two below that, none
        below ``min_batch``. A step's cost grows with its batch down to a few dozen rows, so the
        batch follows the unfinished rows closely there and coarsely below."""
        step = max(self.min_batch, -(-batch // BATCH_SIZE_STEPS))
        powers = {max(self.min_batch, 1 << power) for power in range(step.bit_length())}
        return sorted({*range(step, batch, step), *(p for p in powers if p < min(step, batch))})

    def _compact(self, state: _DecodeState, keep: torch.Tensor) -> _DecodeState:
        """The (prepared) state for the rows ``keep`` of ``state``: its cache rows, masks and
        positions. Both caches may be views of one tensor: each copy reads a gathered copy."""
        smaller = self._states[(len(keep), state.key_valid.shape[1])]
        for source, target in zip(state.cache.layers, smaller.cache.layers, strict=True):
            target.keys.copy_(source.keys.index_select(0, keep))
            target.values.copy_(source.values.index_select(0, keep))
            target.cumulative_length.copy_(source.cumulative_length)
        smaller.key_valid.copy_(state.key_valid.index_select(0, keep))
        smaller.positions.copy_(state.positions.index_select(0, keep))
        smaller.slot.copy_(state.slot)
        return smaller

    def _sample(self, logits: torch.Tensor, spec: SamplingSpec, finished: torch.Tensor,
                seeded: tuple[torch.Tensor, int] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """One token per row from ``logits / temperature`` (top-p when below 1; temperature 0:
        the most likely token, no random draw), its log-prob under the unfiltered distribution
        (the trainer's; at temperature 1 for greedy rows), padding for finished rows.
        ``seeded``: the rows' seeds and the generated position, drawn as the core draws them
        (`graft.rollout.seeded_scores`), else torch's generator."""
        if spec.temperature == 0:
            token = logits.argmax(dim=-1)
        elif seeded is not None:
            if self._token_keys is None or self._token_keys.numel() != logits.shape[-1]:
                self._token_keys = token_keys(logits.shape[-1], logits.device)
            token = seeded_scores(logits, *seeded, temperature=spec.temperature,
                                  top_p=spec.top_p, tokens=self._token_keys).argmax(dim=-1)
        else:
            scores = logits.float() / spec.temperature
            if spec.top_p < 1.0:
                scores = _top_p(scores, spec.top_p)
            probs = torch.softmax(scores, dim=-1)
            # torch.multinomial's own draw of one sample (the argmax of p / q, q ~ Exp(1)): the
            # same tokens, without its checks of p, two more passes over the vocabulary a step
            token = probs.div_(torch.empty_like(probs).exponential_()).argmax(dim=-1)
        temperature = finished.new_full(finished.shape, spec.temperature or 1.0,
                                        dtype=torch.float32)
        logprob = self._compute(SAMPLE_LOGPROBS, lambda: token_logprobs(logits, token,
                                                                         temperature))
        token = torch.where(finished, self.pad_token_id, token)
        logprob = torch.where(finished, 0.0, logprob)
        if self.eos_token_id is not None:
            finished |= token == self.eos_token_id
        return token, logprob

    def _state(self, batch: int, length: int, device: torch.device) -> _DecodeState:
        """The decode state (and its graphs) for ``batch`` rows of up to ``length`` tokens. Its
        cache is the first ``batch`` rows of the largest cache of that length when one exists
        (a smaller batch holds rows of a larger one, never both at once), else its own."""
        length = _round_up(length, CACHE_LENGTH_MULTIPLE)
        key = (batch, length)
        if key not in self._states:
            from transformers import StaticCache

            self._keep_states_of_length(length)
            host = max((k for k in self._states if k[0] > batch), default=None)
            state = _DecodeState(
                cache=StaticCache(config=self.model.config,
                                  max_cache_len=length + self._spare_cache_slots),
                tokens=torch.full((batch, 1), self.pad_token_id, dtype=torch.long, device=device),
                positions=torch.zeros((batch, 1), dtype=torch.long, device=device),
                slot=torch.zeros(1, dtype=torch.long, device=device),
                key_valid=torch.zeros((batch, length), dtype=torch.bool, device=device))
            if host is not None:
                _share_rows(state.cache, self._states[host].cache, batch)
            else:
                self._allocate(state, length)
            if self.use_graphs and device.type == "cuda":
                for attended in self._attended_lengths(length):
                    self._capture(state, attended)
            self._states[key] = state
        return self._states[key]

    def _allocate(self, state: _DecodeState, length: int) -> None:
        """Allocate the state's cache now (transformers allocates a static layer on its first
        write; compaction copies into it) with one eager step, and make each layer's keys and
        values whole-size views: the form the smaller batches' caches have (`_share_rows`), so
        one compiled block graph (`compile_decoder_blocks`) serves every batch."""
        self._step(state, length)
        self._reset(state)
        for layer in state.cache.layers:
            layer.keys, layer.values = layer.keys[:], layer.values[:]

    def _keep_states_of_length(self, length: int) -> None:
        """Let the states (caches, graphs) of other cache lengths go: their memory is batch x
        length per layer; a rollout's batches share one length, the next rollout usually too.
        When no graph is left, the graph memory pool goes with them: CUDA refuses a capture into
        a pool whose graphs are all gone, so the next capture starts a new one, and the old
        pool's memory is released (the allocator keeps a dead pool until ``empty_cache``)."""
        self._states = {k: v for k, v in self._states.items() if k[1] == length}
        if self._graph_pool is not None and not any(s.graphs for s in self._states.values()):
            self._graph_pool = None
            torch.cuda.empty_cache()

    def _prefill(self, state: _DecodeState, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Run the prompts through the model (eagerly) into a reset cache; the last logits."""
        batch, prompt_length = ids.shape
        state.cache.reset()
        valid = mask.bool()
        state.key_valid.zero_()
        state.key_valid[:, :prompt_length] = valid
        slots = torch.arange(state.key_valid.shape[1], device=ids.device)
        queries = torch.arange(prompt_length, device=ids.device)
        causal = slots[None, :] <= queries[:, None]
        # A padded query attends to itself only: a row with no key at all would give NaNs.
        attend = (state.key_valid[:, None, :] & causal[None]) | (slots[None, None, :]
                                                                == queries[None, :, None])
        if self.boolean_mask:  # the grouped-query attention reads only the prompt's slots
            attend = attend[..., :prompt_length]
        positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
        out = self._compute(PREFILL, lambda: self.model(
            input_ids=ids, attention_mask=self._mask(attend[:, None]), position_ids=positions,
            use_cache=True, logits_to_keep=1, **{self._cache_keyword: state.cache}))
        state.positions.copy_(positions[:, -1:] + 1)
        state.slot.fill_(prompt_length)
        return out.logits[:, -1]

    @torch.no_grad()  # its cache views were made without grad: a step must write them so too
    def _step(self, state: _DecodeState, attended: int) -> torch.Tensor:
        """One decode step from the state's fixed tensors (what a graph records), attending to
        the first ``attended`` cache slots."""
        state.key_valid.index_fill_(1, state.slot, True)
        with compiled_blocks(self.fuse_kernels):
            out = self._compute(DECODE, lambda: self.model(
                input_ids=state.tokens,
                attention_mask=self._mask(state.key_valid[:, None, None, :attended].contiguous()),
                position_ids=state.positions, use_cache=True, **{self._cache_keyword: state.cache}))
        state.slot.add_(1)
        state.positions.add_(1)
        return out.logits[:, -1]

    def _compute(self, step: str, run: Callable[[], T]) -> T:
        """``run()``, a ``step`` of the model's decoding, inside the plugins' graft_compute."""
        return compute(step, run, phase=ROLLOUT, model=self.model, cfg=self.cfg)

    def _mask(self, attend: torch.Tensor) -> torch.Tensor:
        """``attend`` (bool, True: attend) as the model's attention takes it. A decode step's
        is a contiguous copy: a slice of the key mask is contiguous only when it covers the
        whole cache, and the compiled blocks would take each layout for another graph."""
        if self.boolean_mask:
            return attend
        return torch.zeros(attend.shape, dtype=self.model.dtype, device=attend.device).masked_fill(
            ~attend, torch.finfo(self.model.dtype).min)

    def _decode(self, state: _DecodeState, attended: int) -> torch.Tensor:
        if attended not in state.graphs:
            return self._step(state, attended)
        state.graphs[attended].replay()
        return state.logits[attended]

    def _capture(self, state: _DecodeState, attended: int) -> None:
        """Record the decode step attending to ``attended`` slots in a CUDA graph: a few runs
        on a side stream first (lazy cache allocation, library workspaces, compilation), then
        the capture, then a reset (the capture itself runs nothing)."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._step(state, attended)
        torch.cuda.current_stream().wait_stream(stream)
        if self._graph_pool is None:
            self._graph_pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._graph_pool):
            state.logits[attended] = self._step(state, attended)
        state.graphs[attended] = graph
        self._reset(state)

    @staticmethod
    def _reset(state: _DecodeState) -> None:
        state.cache.reset()
        state.slot.zero_()
        state.positions.zero_()
        state.key_valid.zero_()


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _rows_to_keep(finished: torch.Tensor, remaining: int,
                  batch_sizes: list[int]) -> torch.Tensor | None:
    """The rows of the smallest of ``batch_sizes`` (ascending) that holds the ``remaining``
    unfinished ones (those first, finished ones filling it up), or None when none smaller than
    the current batch does."""
    fitting = [size for size in batch_sizes if remaining <= size < finished.shape[0]]
    if not fitting:
        return None
    return torch.argsort(finished.to(torch.int8), stable=True)[:fitting[0]]


def _share_rows(cache: object, host: object, rows: int) -> None:
    """Make each layer of the static ``cache`` hold the first ``rows`` rows of ``host``'s
    (allocated) keys and values: views, no memory of its own."""
    for layer, host_layer in zip(cache.layers, host.layers, strict=True):
        keys, values = host_layer.keys[:rows], host_layer.values[:rows]
        layer.lazy_initialization(keys, values)  # dtype, device, heads; allocates, dropped below
        layer.keys, layer.values = keys, values


def _top_p(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """``scores`` with the tokens outside the smallest set whose probability reaches ``top_p``
    set to -inf (the most likely token always stays)."""
    ordered, order = scores.sort(dim=-1, descending=True)
    probs = ordered.softmax(dim=-1)
    drop = probs.cumsum(dim=-1) - probs > top_p
    return scores.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))
