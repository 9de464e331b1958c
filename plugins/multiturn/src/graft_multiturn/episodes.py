"""Multi-turn episodes on any rollout engine: the model and an environment take turns.

One token sequence per episode (token in, token out): the prompt from `Environment.reset`, then
each turn the engine generates from the whole sequence so far and its tokens are appended as
generated, then the environment's answer is appended as rendered
(`graft_multiturn.observations`). A loss mask marks the model's tokens; the engine's log-probs
are kept for them (0 under the environment's tokens, which the mask excludes). Every active
episode of a rank generates its turn in one batch; with several ranks every rank runs as many
turns as the busiest (the embedded engine's decode steps are collectives, the vLLM engine
gathers every rank's prompts on rank 0). Any `graft.rollout.RolloutEngine` serves: a turn is
one ``generate`` of token ids.

An episode an environment call ended is logged: the first `SHOWN_FAILURES` of each run one line
each (with the traceback under ``GRAFT_DEBUG=1``), the rest in one line with their count. A
training step whose every episode ended in an environment error is a warning, and
``features.multiturn.max_failed_env_steps`` such steps in a row stop the run (`EpisodeRunner.check_failures`).
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch

from graft.errors import PluginError
from graft.plugins import call_with_keywords
from graft.rollout import RolloutEngine, RolloutSample, SamplingSpec
from graft_multiturn.chat import (
    Appended,
    ChatTemplate,
    ChatTrajectory,
    TemplateError,
    is_messages,
)
from graft_multiturn.env_calls import EnvFailure, call_all, checked_step
from graft_multiturn.observations import MalformedObservation, observation_ids
from graft_multiturn.tools import resolve_tool_format, turn_text

if TYPE_CHECKING:
    from graft.config import GraftConfig

logger = logging.getLogger("graft.rollout")  # the core's rollout logger (its console lines)
SHOWN_FAILURES = 3  # failed episodes of a run logged one line each; the rest are counted


@dataclass(frozen=True)
class EpisodeLimits:
    """``features.multiturn``'s ``max_turns`` model turns, ``max_episode_tokens`` tokens after
    the prompt (model and environment), ``env_timeout_s`` seconds per environment call."""

    max_turns: int
    max_episode_tokens: int
    timeout_s: float


@dataclass
class Episode:
    """One episode's sequence and bookkeeping."""

    env: Any
    sample: Any
    prompt: list[int]
    response: list[int] = field(default_factory=list)
    model_mask: list[float] = field(default_factory=list)  # 1.0 model token, 0.0 environment's
    logprobs: list[torch.Tensor] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    final_reward_given: bool = False  # the step that ended it returned a number
    turns: int = 0
    tool_calls: int = 0
    done: bool = False
    failure: EnvFailure | None = None
    # on a chat template (reset returned messages): the conversation and its checks
    chat: ChatTrajectory | None = None
    last_turn: list[int] = field(default_factory=list)  # the model's last turn, as generated
    # runs of the response as the model saw it: [role, token count] ("assistant": the model's)
    roles: list[list[Any]] = field(default_factory=list)

    def append(self, ids: list[int], role: str, logprobs: torch.Tensor | None = None) -> None:
        """Append ``ids``: the model's (``role`` assistant, with their log-probs; mask 1) or
        anything else (mask 0, log-prob 0)."""
        if not ids:
            return
        model = role == "assistant"
        self.response += ids
        self.model_mask += [1.0 if model else 0.0] * len(ids)
        self.logprobs.append(logprobs if model and logprobs is not None
                             else torch.zeros(len(ids)))
        if self.roles and self.roles[-1][0] == role:
            self.roles[-1][1] += len(ids)
        else:
            self.roles.append([role, len(ids)])

    def restart(self, sequence: list[int]) -> None:
        """A new segment (``on_prefix_break=resegment``): ``sequence`` (prompt and response,
        the template's rendering of the conversation) replaces the episode's, none of it
        trained."""
        if sequence[:len(self.prompt)] != self.prompt:
            self.prompt, sequence = list(sequence), []
        else:
            sequence = sequence[len(self.prompt):]
        self.response, self.model_mask, self.logprobs, self.roles = [], [], [], []
        self.append(sequence, "history")

    def end(self, failure: EnvFailure | None = None) -> None:
        """Stop the episode (with the reason when an environment call failed)."""
        self.done, self.failure = True, failure

    def failure_line(self) -> str:
        """What ended the episode, for the log (it failed)."""
        origin = getattr(self.sample, "origin", "") or "a sample"
        if self.failure.kind == "malformed_action":
            return f"an episode of {origin} ended with reward 0: {self.failure.reason}"
        return (f"an episode of {origin} ended with reward 0: the environment "
                f"{self.failure.reason}")

    def reward(self) -> float:
        """0 after a failure, else the sum of the environment's rewards."""
        return 0.0 if self.failure is not None else float(sum(self.rewards))

    def needs_score(self) -> bool:
        """Whether the configured reward adds its score of the episode: unless it failed or
        the step that ended it (``done``) returned a reward of its own."""
        return self.failure is None and not self.final_reward_given


@dataclass
class EpisodeBatch:
    """A step's episodes: their samples, the environment's rewards (summed over turns), which
    of them the configured reward (``algorithm.reward``) adds its score to, and metrics
    (``rollout/...``)."""

    samples: list[RolloutSample]
    rewards: list[float]
    scored: list[bool]
    metrics: dict[str, float]

    def total_rewards(self, score: Callable[[list[str], list[Any]], list[float]],
                      responses: Sequence[str], samples: Sequence[Any]) -> list[float]:
        """Each episode's reward: the environment's plus, where `scored` says so, ``score``'s
        (the configured reward: responses and the samples they answer, one call)."""
        wanted = [i for i, flag in enumerate(self.scored) if flag]
        totals = list(self.rewards)
        if wanted:
            for index, value in zip(wanted, score([responses[i] for i in wanted],
                                                  [samples[i] for i in wanted]), strict=True):
                totals[index] += float(value)
        return totals


class EpisodeRunner:
    """Runs episodes of the environment a factory builds (one fresh environment per episode).

    The factory gets the root config ``cfg`` (None in tests without one) and the tokenizer.
    """

    def __init__(self, factory: Any, *, tokenizer: Any, limits: EpisodeLimits,
                 cfg: GraftConfig | None = None, active_episodes: Any = None,
                 sum_over_ranks: Any = None, ranks: int = 1,
                 on_prefix_break: str | None = None) -> None:
        self.make = lambda: call_with_keywords(factory, cfg=cfg, tokenizer=tokenizer)
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.stand_in = getattr(tokenizer, "pad_token_id", None) or 0
        self.limits = limits
        # ranks' largest count of active episodes (every rank runs as many turns); local here
        self.active_episodes = active_episodes or (lambda count: count)
        # a float64 tensor summed over the data-parallel ranks (metrics of every rank's episodes)
        self.sum_over_ranks = sum_over_ranks or (lambda totals: totals)
        self.ranks = ranks
        self.env_s = 0.0
        self.name = getattr(_section(cfg), "environment", "") or "in use"
        # training steps in a row whose every episode ended in an environment error
        self.failed_steps = 0
        self.first_error = ""  # the first environment error of the last run on this rank
        # features.multiturn.on_prefix_break (chat episodes whose template does not append)
        self.on_prefix_break = on_prefix_break or getattr(_section(cfg), "on_prefix_break",
                                                          "keep")
        self._plain_template: ChatTemplate | None = None

    def run(self, engine: RolloutEngine, samples: Sequence[Any], prompts: Sequence[list[int]],
            spec: SamplingSpec) -> EpisodeBatch:
        """One episode per ``(sample, prompt)`` pair (prompts as the data loader encoded them)."""
        self.env_s = 0.0
        episodes = self._start(samples, prompts)
        while self.active_episodes(sum(not e.done for e in episodes)) > 0:
            active = [e for e in episodes if not e.done]
            budgets = [self._budget(e, spec) for e in active]
            turn = replace(spec, max_new_tokens=max(budgets, default=1))
            # a rank without active episodes generates for a stand-in, dropped
            contexts = [e.prompt + e.response for e in active] or [[self.stand_in]]
            generated = engine.generate(contexts, turn)
            self._answer(active, generated, budgets)
        self._report(episodes)
        return EpisodeBatch([self._sample(e) for e in episodes], [e.reward() for e in episodes],
                            [e.needs_score() for e in episodes], self._metrics(episodes))

    def _start(self, samples: Sequence[Any], prompts: Sequence[list[int]]) -> list[Episode]:
        started = time.perf_counter()
        envs = call_all([(self.make, ()) for _ in samples], self.limits.timeout_s)
        built = [i for i, env in enumerate(envs) if not isinstance(env, EnvFailure)]
        resets = list(envs)  # a factory's failure stands for its reset's
        for index, value in zip(built, call_all([(envs[i].reset, (samples[i],)) for i in built],
                                                self.limits.timeout_s), strict=True):
            resets[index] = value
        self.env_s += time.perf_counter() - started
        episodes = []
        for env, sample, prompt, value in zip(envs, samples, prompts, resets, strict=True):
            episode = Episode(env, sample, list(prompt))
            if isinstance(value, EnvFailure):
                episode.end(value)
            elif is_messages(value):
                try:
                    template = ChatTemplate(self.tokenizer, _tool_schemas(env))
                    episode.chat = ChatTrajectory(template, value,
                                                  on_prefix_break=self.on_prefix_break)
                    episode.prompt = episode.chat.prompt_ids
                except TemplateError as exc:
                    episode.end(EnvFailure("error", f"reset returned a prompt the chat "
                                                    f"template cannot render: {exc}"))
            elif value is not None:
                try:
                    episode.prompt = observation_ids(value, self.tokenizer) or list(prompt)
                except MalformedObservation as exc:
                    episode.end(EnvFailure("error", f"reset returned a malformed prompt: {exc}"))
            episodes.append(episode)
        return episodes

    def _budget(self, episode: Episode, spec: SamplingSpec) -> int:
        """The most tokens this turn may add: ``max_new_tokens`` within the episode's limit."""
        left = self.limits.max_episode_tokens - len(episode.response)
        return max(1, min(spec.max_new_tokens, left))

    def _answer(self, active: list[Episode], generated: Sequence[RolloutSample],
                budgets: list[int]) -> None:
        """Append each turn's tokens, then every environment's answer (its calls at once)."""
        actions = []
        for episode, sample, budget in zip(active, generated, budgets, strict=False):
            ids = self._cut(episode.env, list(sample.response_ids[:budget]))
            episode.append(ids, "assistant", sample.logprobs[:len(ids)].float()
                           if sample.logprobs is not None else torch.zeros(len(ids)))
            episode.last_turn = ids
            episode.turns += 1
            actions.append((ids, self.tokenizer.decode(ids, skip_special_tokens=True)))
        started = time.perf_counter()
        answers = call_all([(e.env.step, action) for e, action in zip(active, actions,
                                                                       strict=True)],
                           self.limits.timeout_s)
        self.env_s += time.perf_counter() - started
        for episode, answer in zip(active, answers, strict=True):
            self._apply(episode, checked_step(answer))

    def _cut(self, env: Any, ids: list[int]) -> list[int]:
        """The turn up to the first token at which its text contains one of ``env.stop``."""
        stops = tuple(getattr(env, "stop", ()) or ())
        text = self.tokenizer.decode(ids, skip_special_tokens=True) if stops else ""
        if not any(stop in text for stop in stops):
            return ids
        low, high = 1, len(ids)  # the shortest prefix whose text holds a stop string
        while low < high:  # a binary search: a turn of n tokens costs log2(n) decodes
            middle = (low + high) // 2
            prefix = self.tokenizer.decode(ids[:middle], skip_special_tokens=True)
            if any(stop in prefix for stop in stops):
                high = middle
            else:
                low = middle + 1
        return ids[:low]

    def _apply(self, episode: Episode, answer: tuple[Any, float | None, bool] | EnvFailure
               ) -> None:
        """Record the environment's answer; end the episode when it is done or at a limit."""
        if isinstance(answer, EnvFailure):
            return episode.end(answer)
        observation, reward, done = answer
        if reward is not None:
            episode.rewards.append(reward)
        episode.final_reward_given = done and reward is not None
        limit = self.limits.max_episode_tokens
        if done or episode.turns >= self.limits.max_turns or len(episode.response) >= limit:
            return episode.end()
        try:
            appended = self._observation(episode, observation)
        except (MalformedObservation, TemplateError) as exc:
            return episode.end(EnvFailure("error", f"step returned a malformed observation: "
                                                   f"{exc}"))
        if appended.resegment:
            episode.restart(appended.ids)
        elif appended.ids:
            if len(episode.response) + len(appended.ids) >= limit:  # no room for a model turn
                return episode.end()
            episode.append(appended.ids, _role(observation))
        if appended.ids:
            episode.tool_calls += 1
        if len(episode.response) >= limit:
            episode.end()

    def _observation(self, episode: Episode, observation: Any) -> Appended:
        """What the environment's answer appends (`graft_multiturn.chat`): messages through
        the template (checked against the conversation on a chat episode), else the
        observation's ids as they are."""
        if not is_messages(observation):
            ids = observation_ids(observation, self.tokenizer)
            if ids and episode.chat is not None:
                episode.chat.untracked()
            return Appended(ids)
        if episode.chat is None:  # messages after a prompt that was not: closed, rendered
            template = self._template()
            return Appended(template.close(episode.last_turn)
                            + template.observation_ids(observation))
        return episode.chat.observe(episode.prompt + episode.response, episode.last_turn,
                                    self._assistant(episode), observation)

    def _assistant(self, episode: Episode) -> dict[str, Any]:
        """The model's last turn as a message, as its environment's ``tool_format`` reads
        it (content only without one)."""
        format_ = getattr(episode.env, "tool_format", None)
        if format_ is None:
            return {"role": "assistant", "content": turn_text(episode.last_turn, self.tokenizer)}
        format_ = resolve_tool_format(format_, self.tokenizer)
        text = turn_text(episode.last_turn, self.tokenizer, keep=getattr(format_, "ends", ()))
        return format_.message(format_.parse(text))

    def _template(self) -> ChatTemplate:
        if self._plain_template is None:
            self._plain_template = ChatTemplate(self.tokenizer)
        return self._plain_template

    def _sample(self, episode: Episode) -> RolloutSample:
        logprobs = torch.cat(episode.logprobs) if episode.logprobs else torch.zeros(0)
        return RolloutSample(episode.prompt, episode.response, logprobs,
                             loss_mask=torch.tensor(episode.model_mask, dtype=torch.float32),
                             turns=[(role, count) for role, count in episode.roles])

    def _report(self, episodes: list[Episode]) -> None:
        """Log the failed episodes: `SHOWN_FAILURES` one line each (with the traceback under
        ``GRAFT_DEBUG=1``), the rest in one line counting them by kind."""
        failed = [e for e in episodes if e.failure is not None]
        errors = [e for e in failed if e.failure.kind == "error"]
        self.first_error = errors[0].failure.reason if errors else ""
        debug = os.environ.get("GRAFT_DEBUG") == "1"
        hinted = False
        for episode in failed[:SHOWN_FAILURES]:
            line, detail = episode.failure_line(), episode.failure.detail.rstrip()
            if detail and debug:
                line += "\n" + detail
            elif detail and not hinted:
                line, hinted = line + " (GRAFT_DEBUG=1 shows where)", True
            # a malformed action is the model's doing: counted, not alarming
            logger.log(logging.INFO if episode.failure.kind == "malformed_action"
                       else logging.WARNING, line)
        rest = Counter(e.failure.kind for e in failed[SHOWN_FAILURES:])
        if rest:
            counts = ", ".join(f"{count} {KIND_NAMES[kind]}" for kind, count in rest.items())
            logger.log(logging.WARNING if rest["error"] else logging.INFO,
                       "%d more episodes ended with reward 0 (%s; rollout/env_errors, "
                       "rollout/malformed_actions)", sum(rest.values()), counts)

    def check_failures(self, batch: EpisodeBatch) -> None:
        """After a training step's episodes (every rank, on metrics summed over the ranks):
        warn when every episode ended in an environment error; after
        ``features.multiturn.max_failed_env_steps`` such steps in a row (0: never), a
        `PluginError`."""
        if batch.metrics.get("rollout/env_error_fraction", 0.0) < 1.0:
            self.failed_steps = 0
            return
        self.failed_steps += 1
        limit = getattr(_section(self.cfg), "max_failed_env_steps", 0) or 0
        where = f"; the first on this rank {self.first_error}" if self.first_error else ""
        if limit and self.failed_steps >= limit:
            raise PluginError(
                f"every episode of the last {self.failed_steps} steps ended in an error of the "
                f"environment {self.name!r} (reward 0 for all: nothing to learn{where}); fix the "
                f"environment (GRAFT_DEBUG=1 shows its tracebacks), or set "
                f"features.multiturn.max_failed_env_steps=0 to train on")
        if _is_main():
            logger.warning(
                "warning: every episode of this step ended in an error of the environment %r "
                "(reward 0 for all: nothing to learn%s); %s", self.name, where,
                f"the run stops after {limit} such steps in a row "
                f"(features.multiturn.max_failed_env_steps)"
                if limit else "features.multiturn.max_failed_env_steps=0: the run goes on")

    def _metrics(self, episodes: list[Episode]) -> dict[str, float]:
        """Means over every rank's episodes, counts summed over the ranks, the share of them
        an environment error ended, and each rank's mean seconds in environment calls."""
        failures = [e.failure.kind for e in episodes if e.failure is not None]
        totals = self.sum_over_ranks(torch.tensor(
            [float(len(episodes)), float(sum(e.turns for e in episodes)),
             float(sum(e.tool_calls for e in episodes)), float(failures.count("error")),
             float(failures.count("malformed_action")), self.env_s,
             float(sum(e.chat.breaks for e in episodes if e.chat is not None))],
            dtype=torch.float64))
        count, turns, calls, errors, malformed, env_s, breaks = (float(v) for v in totals)
        return {"rollout/turns_mean": turns / max(count, 1.0),
                "rollout/tool_calls_mean": calls / max(count, 1.0),
                "rollout/env_errors": errors, "rollout/malformed_actions": malformed,
                "rollout/env_error_fraction": errors / max(count, 1.0),
                "rollout/env_s": env_s / self.ranks,
                "multiturn/prefix_breaks": breaks / max(count, 1.0)}


KIND_NAMES = {"error": "environment errors", "malformed_action": "malformed actions"}


def _tool_schemas(env: Any) -> list[dict[str, Any]] | None:
    """The environment's ``tools`` attribute as the chat template's ``tools`` (schemas, or
    `graft_multiturn.tools.Tool` objects), or None."""
    tools = getattr(env, "tools", None)
    if not tools:
        return None
    return [dict(getattr(t, "schema", t)) for t in tools]


def _role(observation: Any) -> str:
    """The role an observation shows with in ``samples.jsonl``: its messages' (``tool``,
    ``user``), or ``environment`` for text and ids."""
    if is_messages(observation):
        return str(observation[0].get("role", "environment"))
    return "environment"


def _section(cfg: GraftConfig | None) -> Any:
    """``features.multiturn`` of the root config (None without one: tests)."""
    return getattr(getattr(cfg, "features", None), "multiturn", None)


def _is_main() -> bool:
    """Whether this is rank 0 (or the only process)."""
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0
