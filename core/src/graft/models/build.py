"""Building the bare (unsharded) model from ``cfg.model``: a preset or a local HF directory."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graft.errors import ConfigError, did_you_mean, few
from graft.models.family import ModelFamily
from graft.models.registry import family_for, preset
from graft.plugins import GraftPluginManager, get_plugin_manager

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig

    from graft.config.schema import ModelConfig

_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


def build_model(model_cfg: ModelConfig, *, seed: int = 0, device: torch.device | str = "cpu",
                manager: GraftPluginManager | None = None) -> tuple[torch.nn.Module, ModelFamily]:
    """Build the model ``model_cfg`` describes, in master-weight dtype; return it and its family.

    A preset is initialised from ``seed`` directly on ``device`` (same seed, same weights on
    every rank of one device type); a local directory is loaded on CPU with ``from_pretrained``
    and never downloads anything.
    """
    import torch
    from transformers import AutoModelForCausalLM

    kwargs = _model_kwargs(model_cfg)
    config, family = resolve_config(model_cfg, manager)
    if model_cfg.path:
        model_weights(model_cfg.path)
        model = AutoModelForCausalLM.from_pretrained(model_cfg.path, config=config,
                                                     local_files_only=True, **kwargs)
    else:
        torch.manual_seed(seed)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, **kwargs)
        if family.init_weights is not None:
            with torch.no_grad():
                family.init_weights(model, seed)
    _finish(model, model_cfg, family)
    return model, family


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on the meta device (no memory) while buffers
    (rotary tables and the like, computed at construction) stay real."""
    import torch

    register = torch.nn.Module.register_parameter

    def register_on_meta(module: torch.nn.Module, name: str, param: Any) -> None:
        if param is not None and param.device.type != "meta":
            param = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    torch.nn.Module.register_parameter = register_on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]


def build_empty_model(model_cfg: ModelConfig, *, manager: GraftPluginManager | None = None
                      ) -> tuple[torch.nn.Module, ModelFamily]:
    """The model ``model_cfg`` describes with its parameters on the meta device (buffers real),
    in master-weight dtype, and its family: shard it first, then fill it
    (`load_pretrained_weights`)."""
    from transformers import AutoModelForCausalLM

    config, family = resolve_config(model_cfg, manager)
    with parameters_on_meta():
        model = AutoModelForCausalLM.from_config(config, **_model_kwargs(model_cfg))
    _finish(model, model_cfg, family)
    return model, family


def load_pretrained_weights(model: torch.nn.Module, model_cfg: ModelConfig, *,
                            is_main: bool, every_rank_reads: bool = False, seed: int = 0) -> None:
    """Fill a sharded model (`build_empty_model`, then parallelized) from ``model.path``: rank 0
    reads the checkpoint (``from_pretrained`` on CPU: one host copy for the whole run) and each
    parameter is broadcast and kept as each rank's shard. Call on every rank.

    ``every_rank_reads``: each rank reads the checkpoint itself and nothing is broadcast (one
    host copy per rank): for ranks split into roles (``graft_rank_roles``), whose models are
    sharded over a part of the ranks while torch's broadcast spans them all.

    Parameters the checkpoint lacks are initialised by the plugins that made them
    (``graft_weights_loaded``, from ``seed``); any other missing or unexpected weight is a
    `ConfigError` naming it."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        set_model_state_dict,
    )
    from transformers import AutoModelForCausalLM

    full: dict[str, Any] = {}
    if is_main or every_rank_reads:
        model_weights(model_cfg.path)
        config, _ = resolve_config(model_cfg)
        source = AutoModelForCausalLM.from_pretrained(model_cfg.path, config=config,
                                                      local_files_only=True,
                                                      **_model_kwargs(model_cfg))
        full = source.state_dict()
        del source
    # Compared here, not taken from set_model_state_dict's result: with strict=False torch loads
    # the model's own values for the names the checkpoint lacks (it reports none missing), and
    # sees unexpected names only where the checkpoint was read (rank 0 when it broadcasts).
    names = set(get_model_state_dict(model))
    found = ((sorted(names - full.keys()), sorted(full.keys() - names))
             if is_main or every_rank_reads else None)
    if not every_rank_reads and dist.is_initialized() and dist.get_world_size() > 1:
        holder = [found]
        dist.broadcast_object_list(holder, src=0)  # as torch's broadcast of the weights does
        found = holder[0]
    missing, unexpected = found
    if unexpected:
        raise ConfigError(f"model.path {model_cfg.path}: the checkpoint has weights the model built "
                          f"from its config lacks ({few(unexpected)}); check that its "
                          f"config.json matches the weights, and model.config_overrides")
    set_model_state_dict(model, full, options=StateDictOptions(
        full_state_dict=True, broadcast_from_rank0=not every_rank_reads, strict=False))
    filled = get_plugin_manager().hook.graft_weights_loaded(
        model=model, missing=list(missing), seed=seed) if missing else []
    unfilled = sorted(set(missing) - {name for names in filled for name in names})
    if unfilled:
        raise ConfigError(f"model.path {model_cfg.path}: the checkpoint has no weights for "
                          f"{few(unfilled)}, and no plugin initialises them "
                          f"(graft_weights_loaded); check that its config.json matches the weights, "
                          f"and model.config_overrides")



def _model_kwargs(model_cfg: ModelConfig) -> dict[str, Any]:
    import torch

    kwargs: dict[str, Any] = {"dtype": torch.bfloat16 if model_cfg.dtype == "bfloat16"
                              else torch.float32}
    if model_cfg.attn_implementation:
        kwargs["attn_implementation"] = model_cfg.attn_implementation
    return kwargs


def _finish(model: torch.nn.Module, model_cfg: ModelConfig, family: ModelFamily) -> None:
    if model_cfg.experts_implementation:
        model.set_experts_implementation(model_cfg.experts_implementation)
    model.config.use_cache = False
    if family.prepare_model is not None:
        family.prepare_model(model)


def build_skeleton(model_cfg: ModelConfig) -> torch.nn.Module:
    """The model ``model_cfg`` describes on the meta device: its config and layout, no memory."""
    return meta_model(resolve_config(model_cfg)[0])


def meta_model(config: PretrainedConfig) -> torch.nn.Module:
    """A ``*ForCausalLM`` of ``config`` on the meta device: parameter names and shapes, no data."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def resolve_config(model_cfg: ModelConfig, manager: GraftPluginManager | None = None
                   ) -> tuple[PretrainedConfig, ModelFamily]:
    """The HF config ``model_cfg`` describes, with ``model.overrides`` applied, and its family.

    A local directory's ``config.json`` is read (no weights); a preset's factory is called with
    the overrides, so derived fields follow them. Unknown override names are `ConfigError`s.
    """
    if model_cfg.path:
        config = load_local_config(model_cfg.path)
        apply_config_overrides(config, model_cfg.overrides)
        return config, family_for(config.model_type, manager)
    family, factory = preset(model_cfg.preset, manager)
    check_override_keys(factory(), model_cfg.overrides)
    return factory(**model_cfg.overrides), family


def model_dir(path: str) -> Path:
    """The local model directory ``model.path`` names: it must exist and hold ``config.json``.

    Cheap (no torch or transformers import): ``graft train`` checks it before launching ranks.
    """
    folder = Path(path).expanduser()
    if not folder.exists():
        hint = ""
        if _HUB_ID.match(path):
            hint = (f" It looks like a Hugging Face Hub id; Graft never downloads at run time. "
                    f"Download it first (hf download {path} --local-dir DIR) and set "
                    f"model.path=DIR.")
        raise ConfigError(f"model.path {path!r} does not exist.{hint}")
    if not (folder / "config.json").is_file():
        raise ConfigError(f"model.path {path!r} is not a Hugging Face model directory: it has no "
                          f"config.json (expected config.json plus *.safetensors weights)")
    return folder


# The weight files ``from_pretrained`` reads, in its order: one file, or an index of shards.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


def model_weights(path: str) -> list[Path]:
    """The weight files of the model directory ``model.path`` (`model_dir`): one of
    `WEIGHT_FILES`, and for an index every shard it names; `ConfigError` naming what is missing.
    Cheap (no torch or transformers import): ``graft train`` checks it before launching ranks."""
    import json

    folder = model_dir(path)
    found = next((folder / name for name in WEIGHT_FILES if (folder / name).is_file()), None)
    if found is None:
        raise ConfigError(f"model.path {path!r} has config.json but no weights: expected "
                          f"{' or '.join(WEIGHT_FILES)}. Copy the weight files into it (hf download "
                          f"MODEL_ID --local-dir {path} fetches config, weights and tokenizer)")
    if not found.name.endswith(".index.json"):
        return [found]
    try:
        shards = sorted(set(json.loads(found.read_text())["weight_map"].values()))
    except (OSError, ValueError, KeyError, AttributeError) as exc:
        raise ConfigError(f"model.path {path!r}: cannot read the shard list of {found}: "
                          f"{exc}") from exc
    missing = [name for name in shards if not (folder / name).is_file()]
    if missing:
        raise ConfigError(f"model.path {path!r}: {found.name} names {len(shards)} weight files but "
                          f"{len(missing)} are missing ({', '.join(missing[:3])}"
                          f"{', ...' if len(missing) > 3 else ''}); copy them into {folder}")
    return [folder / name for name in shards]


def local_model_type(path: str) -> str | None:
    """``model_type`` of the local model directory ``model.path`` (its config.json); None when
    there is no such directory here (an example for a cluster: loading reports it, with the
    fix). Cheap (no transformers import): for config rules that run before any rank starts."""
    import json

    config = Path(path).expanduser() / "config.json"
    if not config.is_file():
        return None
    try:
        return json.loads(config.read_text())["model_type"]
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"model.path {path!r}: cannot read model_type from {config}: "
                          f"{exc}") from exc


def load_local_config(path: str) -> PretrainedConfig:
    """Read ``config.json`` of a local model directory; clear errors for everything else."""
    from transformers import AutoConfig

    folder = model_dir(path)
    try:
        return AutoConfig.from_pretrained(folder, local_files_only=True)
    except (ValueError, OSError) as exc:
        raise ConfigError(f"model.path {path!r}: cannot read config.json: {exc}") from exc


def check_override_keys(config: PretrainedConfig, overrides: dict[str, Any]) -> None:
    """Unknown ``model.overrides`` field names are errors (transformers would accept them)."""
    known = set(config.to_dict())
    for key in overrides:
        if key not in known:
            raise ConfigError(f"model.overrides.{key}: {type(config).__name__} has no field "
                              f"{key!r}.{did_you_mean(key, known)}")


def apply_config_overrides(config: PretrainedConfig, overrides: dict[str, Any]) -> None:
    """Set ``model.overrides`` entries on a loaded checkpoint's config."""
    check_override_keys(config, overrides)
    for key, value in overrides.items():
        setattr(config, key, value)
