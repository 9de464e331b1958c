"""`InferenceCopy`: a plain (unsharded, no FSDP) copy of the trained model for generation.

It holds every parameter and buffer whole on this rank's device, in the compute dtype (what the
trainer's forward casts to under mixed precision), so generation runs without FSDP hooks or
collectives and transformers can compile its decode step. `refresh` copies the trained weights in
(gathered from their shards, one tensor at a time); the rollout engine calls it after each update.
A parameter that does not train (``requires_grad`` False: a frozen base under adapters) cannot
have changed, so only the first refresh copies it (a resumed or rollout-worker build reads it
from the same seed or ``model.path`` before the copy exists); what a plugin computes at each export
(``graft_export_entries``: merged adapters) is computed and copied every time.

Where a plugin's adapters are to be applied unmerged (``graft_rollout_adapter``, the user's
adapter-only sync), the copy holds the frozen base instead and the adapter installs itself after
every refresh (`graft.rollout.RolloutAdapter.install`). A frozen parameter that is whole on this
rank already, on the copy's device and in its dtype, is then the trained model's own tensor, not a
second copy: on one rank the copy costs only the adapters.
"""

from __future__ import annotations

import copy
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import torch

from graft.export.gather import gather_full, is_sharded, local_tensor
from graft.export.handlers import entry_tensor, exported_entries
from graft.models.registry import family_for
from graft.plugins import GraftPluginManager, get_plugin_manager

if TYPE_CHECKING:
    from graft.config.schema import GraftConfig


class InferenceCopy:
    """The trained model's architecture with its own weights in ``dtype`` on ``device``.

    ``cfg`` (the root config) and ``manager`` (the plugin manager; the process's by default)
    are what ``graft_inference_copy`` gets and who answers it.
    """

    def __init__(self, trained: torch.nn.Module, *, dtype: torch.dtype, device: torch.device,
                 compile_backend: str = "inductor", cfg: GraftConfig | None = None,
                 manager: GraftPluginManager | None = None) -> None:
        from transformers import AutoModelForCausalLM

        config = copy.deepcopy(trained.config)
        config.use_cache = True
        attention = getattr(config, "_attn_implementation", None)
        # FlexAttention pays off on packed training rows; transformers' generation with a
        # padded KV cache does not support it, and SDPA is the fast path there.
        kwargs = {"attn_implementation": "sdpa"} if attention == "flex_attention" else {}
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, **kwargs)
        self._hook = (manager or get_plugin_manager()).hook
        adapter = self._hook.graft_rollout_adapter(model=trained, cfg=cfg)
        self.adapter = adapter if adapter is not None and adapter.required else None
        self._shared = (share_frozen(model, trained, device=device, dtype=dtype, adapter=adapter)
                        if self.adapter is not None else set())
        materialise(model, device)
        model.tie_weights()  # materialising gives each module a tensor of its own: tied ones too
        family = family_for(config.model_type)
        if family.prepare_model is not None:
            family.prepare_model(model)
        if getattr(trained, "generation_config", None) is not None:
            model.generation_config = copy.deepcopy(trained.generation_config)
        self.model = model.eval().requires_grad_(False)
        self.compile_backend = compile_backend
        self.trained = trained
        self.dtype = dtype
        self.cfg = cfg
        self._targets = dict(self.model.state_dict(keep_vars=True))
        self._buffers = {name for name, _ in self.model.named_buffers()}
        self._frozen_copied = False
        self.refresh()

    def cache_options(self) -> dict[str, Any]:
        """``generate`` options: a static KV cache (compiled decode on GPU) for models
        transformers can compile whole; the default growing cache for the others (DeepSeek-V4's
        compressed attention has no static cache)."""
        if not getattr(self.model, "_can_compile_fullgraph", False):
            return {}
        if self.compile_backend == "none":
            return {"cache_implementation": "static", "disable_compile": True}
        if self.compile_backend == "cudagraphs":
            from transformers import CompileConfig

            config = CompileConfig(backend="cudagraphs", mode="default")
            return {"cache_implementation": "static", "compile_config": config}
        return {"cache_implementation": "static"}

    @torch.no_grad()
    def refresh(self) -> None:
        """Copy the trained model's current weights in (a collective: every rank calls it), then
        let plugins make the copy compute what the policy does (``graft_inference_copy``)."""
        with self.adapter.base_only() if self.adapter is not None else nullcontext():
            for name, entry in exported_entries(self.trained):
                if name in self._shared or (self._frozen_copied and _frozen(entry)):
                    continue
                whole, _ = gather_full(entry_tensor(entry), dtype=self.dtype)
                self._targets[name].copy_(whole)
        self._frozen_copied = True
        # Non-persistent buffers (rotary tables) are not in the state dict: take them as they are.
        for name, buffer in self.trained.named_buffers():
            if name in self._buffers and name not in self._targets:
                self.model.get_buffer(name).copy_(buffer)
        if self.adapter is not None:
            self.adapter.install(self.model)
        self._hook.graft_inference_copy(model=self.model, trained=self.trained, cfg=self.cfg)


def share_frozen(model: torch.nn.Module, trained: torch.nn.Module, *, device: torch.device,
                 dtype: torch.dtype, adapter: Any) -> set[str]:
    """Make each frozen parameter of the meta-device ``model`` that ``trained`` holds whole on
    this rank, on ``device`` and in ``dtype``, the trained tensor itself; return their names.
    The entries are the frozen base's (inside ``adapter.base_only()``)."""
    targets = model.state_dict(keep_vars=True)
    shared: set[str] = set()
    with adapter.base_only():
        for name, entry in exported_entries(trained):
            if not _frozen(entry) or is_sharded(entry) or name not in targets:
                continue
            tensor = local_tensor(entry)
            if (tensor.dtype != dtype or tensor.shape != targets[name].shape
                    or tensor.device.type != device.type
                    or device.index not in (None, tensor.device.index)):
                continue
            owner, _, leaf = name.rpartition(".")
            model.get_submodule(owner)._parameters[leaf] = torch.nn.Parameter(
                tensor, requires_grad=False)
            shared.add(name)
    return shared


def materialise(model: torch.nn.Module, device: torch.device) -> None:
    """Give every parameter and buffer of ``model`` still on the meta device an uninitialised
    tensor on ``device`` (``Module.to_empty``, leaving the tensors already real as they are)."""
    for module in model.modules():
        for store in (module._parameters, module._buffers):
            for key, value in store.items():
                if value is None or not value.is_meta:
                    continue
                empty = torch.empty_like(value, device=device)
                store[key] = (torch.nn.Parameter(empty, requires_grad=False)
                              if isinstance(value, torch.nn.Parameter) else empty)


def _frozen(entry: Any) -> bool:
    """Whether an exported entry is a parameter the optimizer never changes (buffers may change
    outside it, computed entries change with what they are computed from)."""
    return isinstance(entry, torch.nn.Parameter) and not entry.requires_grad
