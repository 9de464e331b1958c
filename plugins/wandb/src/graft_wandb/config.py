"""The ``features.wandb`` config section (no wandb here: imported by every command)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from graft.config import choice
from graft.errors import ConfigError

SECTION = "wandb"


@dataclass
class WandbConfig:
    """``features.wandb``: every step's metrics and the run's config to Weights & Biases."""

    # Log to W&B (the main rank; the run's id is kept in <run_dir>/wandb-run.json, so a resumed
    # run continues the same W&B run).
    enabled: bool = False
    # The W&B project the run goes to; null = WANDB_PROJECT when it is set, else graft.
    project: str | None = None
    # The W&B team or user; null = WANDB_ENTITY, else your default entity (`wandb login`).
    entity: str | None = None
    # online: sent as it is logged (needs `wandb login` or WANDB_API_KEY); offline: written
    # under the run directory, `wandb sync` sends it later; disabled: nothing is written;
    # auto = WANDB_MODE when it is set, else online.
    mode: str = choice("auto", ("auto", "online", "offline", "disabled"))
    # The run's name in W&B; null = the run directory's name.
    name: str | None = None
    # Runs of one group are shown together in W&B; null = none.
    group: str | None = None
    # Tags of the W&B run.
    tags: list[str] = field(default_factory=list)


def wandb_section(cfg: Any) -> WandbConfig:
    """``cfg.features.wandb`` of ``cfg`` (the root config), or the defaults (off) for a config
    composed without this plugin's section."""
    section = getattr(getattr(cfg, "features", None), SECTION, None)
    return WandbConfig() if section is None else section


def require_wandb() -> None:
    """`ConfigError` naming the pip command when ``features.wandb.enabled=true`` cannot log
    (the wandb package is not installed)."""
    try:
        import wandb  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"features.wandb.enabled=true needs the wandb package ({exc}): "
                          f"`pip install wandb`, or set features.wandb.enabled=false") from exc
