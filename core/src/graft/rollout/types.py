"""What every rollout engine takes and returns, and what a plugin's episode runner
(``graft_episode_runner``) does in its place."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from graft.errors import PluginError


@dataclass(frozen=True)
class SamplingSpec:
    """How to sample: from ``rollout.*`` (training) or ``val.*`` (validation).

    ``temperature`` 0 means greedy (the most likely token; validation's default): an engine
    then draws no random numbers and reports log-probs at temperature 1. ``seeds``: one per
    prompt of a `RolloutEngine.generate` call (``rollout.seeded_sampling``): row i's tokens
    depend only on its seed, its prompt and the weights, never on the other rows; an engine
    that cannot honour them raises a `PluginError`. None: the engine's own generator.
    """

    temperature: float
    top_p: float
    max_new_tokens: int
    seeds: tuple[int, ...] | None = None


@dataclass
class RolloutSample:
    """One generated response.

    Attributes:
        prompt_ids / response_ids: token ids (the response ends with ``eos`` unless it was cut
            at ``max_new_tokens``).
        logprobs: the generator's log-probability of each response token under
            ``logits / temperature`` (fp32, ``len(response_ids)``); None when the engine does
            not report them (the trainer then computes them, phase ``rollout_logprobs``).
        extras: per-token tensors plugins recorded (``graft_rollout_end``), one row per token of
            prompt + response.
        engine_extras: per-request outputs a plugin asked the engine for
            (``RolloutEngine.request_extras``), as the engine returned them (e.g. a serving
            engine's ``routed_experts`` array); plugins turn them into ``extras``.
        loss_mask: which response tokens the loss covers (``len(response_ids)``, 1.0 or 0.0):
            a multi-turn episode's model tokens (graft-multiturn's episodes), not the
            environment's; None: every response token (a single-turn response).
        turns: the response in runs as the model saw them, ``[(role, token count), ...]``
            summing to ``len(response_ids)`` (an episode's ``assistant`` turns and its
            ``tool``/``user`` observations, as graft-multiturn records them); only
            ``samples.jsonl`` reads it (`graft.training.samples.shown_to_model`). None: runs of
            the ``loss_mask``.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: torch.Tensor | None
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    engine_extras: dict[str, Any] = field(default_factory=dict)
    loss_mask: torch.Tensor | None = None
    turns: list[tuple[str, int]] | None = None


class RolloutEngine(Protocol):
    """Generates responses and takes new weights after every update.

    What plugins see of it (``graft_rollout_begin/end``): ``kind`` (the ``rollout.engine``
    name), ``model`` (the generating ``torch.nn.Module`` when it runs in the trainer, else
    None), ``llm`` (an external engine's handle on the rank that hosts it, such as
    graft-vllm's ``vllm.LLM``, else None) and `request_extras`.
    """

    kind: str
    model: torch.nn.Module | None
    llm: Any

    def request_extras(self, *names: str) -> None:
        """Ask for per-request outputs (``sample.engine_extras[name]``); `PluginError` when the
        engine cannot return one, or when it must be asked before the engine starts."""

    def generate(self, prompts: list[list[int]], spec: SamplingSpec) -> list[RolloutSample]:
        """One response per prompt (repeat a prompt for several samples); every rank calls it."""

    def sync_weights(self) -> dict[str, float]:
        """Make the engine use the trainer's current weights; returns metrics (seconds, bytes)."""

    def close(self) -> None:
        """Release the engine."""


class RolloutAdapter(Protocol):
    """Adapters an inference engine can load itself in place of merged weights
    (``graft_rollout_adapter``; graft-lora's): the engine takes the frozen base once and, after
    every update, only the adapters: written as a PEFT adapter directory (graft-vllm), or
    installed unmerged in a plain copy of the policy (the embedded engine's static decode copy,
    which does so only when ``required``; otherwise it takes merged weights, the faster decode).

    ``rank``: the adapters' largest rank (the engine's ``max_lora_rank``). ``targets``: what
    they adapt (PEFT's ``target_modules`` and ``target_parameters``), named in an engine's
    refusal. ``fallback``: the setting that makes the engine take merged weights at every sync
    instead (``features.lora.engine_sync=merged``), named in that refusal. ``required``:
    whether the user asked for adapter-only sync; False lets an engine that cannot serve the
    adapters take merged weights instead (saying so) rather than refuse.
    """

    rank: int
    targets: list[str]
    fallback: str
    required: bool

    def base_only(self) -> AbstractContextManager[None]:
        """Inside it, exports of the model carry the frozen base without the adapters (not
        merged, the adapters left out): the engine's first weights."""

    def write(self, out_dir: Path, *, is_main: bool) -> None:
        """Write the current adapters to ``out_dir`` as a PEFT adapter directory
        (``adapter_config.json``, ``adapter_model.safetensors``), replaced whole. Every rank
        calls it (the adapters are gathered from their shards); ``is_main`` writes."""

    def install(self, model: torch.nn.Module) -> None:
        """Give ``model``, a plain copy of the policy holding the frozen base (the embedded
        engine's static decode copy: unsharded, in the compute dtype), the current adapters,
        applied unmerged as the trainer's forward applies them: the first call adds them,
        later ones copy their new values in. Every rank calls it (the adapters are gathered
        from their shards); it must not change the copy's parameters."""


@runtime_checkable
class EpisodeBatch(Protocol):
    """What an `EpisodeRunner` made of one step's (or one validation's) prompts."""

    # one sample per prompt given, in their order (``loss_mask`` marks the tokens trained on)
    samples: list[RolloutSample]
    # logged with the step's metrics (graft-multiturn's ``rollout/turns_mean``...); every rank
    # holds the same values
    metrics: dict[str, float]

    def total_rewards(self, score: Callable[[list[str], list[Any]], list[float]],
                      responses: Sequence[str], samples: Sequence[Any]) -> list[float]:
        """Each sample's reward, with ``score`` the run's configured reward (decoded
        ``responses`` and the data samples they answer, one call for those the runner wants
        scored)."""


@runtime_checkable
class EpisodeRunner(Protocol):
    """Makes samples from prompts in place of one `RolloutEngine.generate` (a plugin's, from
    ``graft_episode_runner``: graft-multiturn's episodes, the model and an environment taking
    turns); the RL job and its validation call it on every rank."""

    def run(self, engine: RolloutEngine, samples: Sequence[Any], prompts: Sequence[list[int]],
            spec: SamplingSpec) -> EpisodeBatch:
        """Samples for the data ``samples`` (`graft.data.tasks.TextSample`) whose encoded
        prompts are ``prompts`` (one each), generated with ``engine`` as ``spec`` says; every
        rank calls it, also one without prompts (its engine's collectives must pair)."""

    def check_failures(self, batch: EpisodeBatch) -> None:
        """After a training step's `run` (not validation's): warn about, or stop the run for
        (a `graft.errors.GraftError`), what went wrong in ``batch``."""


def refuse_extras(kind: str, names: tuple[str, ...], supported: tuple[str, ...] = ()) -> None:
    """`PluginError` for the first of ``names`` that engine ``kind`` cannot return."""
    for name in names:
        if name not in supported:
            raise PluginError(f"the {kind} rollout engine cannot return the per-request output "
                              f"{name!r} (it returns: {', '.join(supported) or 'none'}); record "
                              f"it with hooks on rollout.model instead, or use an engine that "
                              f"returns it")


def cut_at_eos(tokens: list[int], eos_id: int | None) -> list[int]:
    """A generated row up to and including the first ``eos`` (the padding after it dropped)."""
    if eos_id is not None and eos_id in tokens:
        return tokens[:tokens.index(eos_id) + 1]
    return list(tokens)
