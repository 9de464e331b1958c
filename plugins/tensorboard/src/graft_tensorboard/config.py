"""The ``features.tensorboard`` config section (no tensorboard here: imported by every command)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graft.errors import ConfigError

SECTION = "tensorboard"


@dataclass
class TensorBoardConfig:
    """``features.tensorboard``: every step's metrics as TensorBoard scalars."""

    # Write every step's numeric metrics as TensorBoard events to <run_dir>/tensorboard (the
    # main rank; a resumed run supersedes the steps it does again, so each step appears once).
    # Needs the tensorboard package (`pip install tensorboard`); without it the run is refused.
    enabled: bool = False


def tensorboard_section(cfg: Any) -> TensorBoardConfig:
    """``cfg.features.tensorboard`` of ``cfg`` (the root config), or the defaults (off) for a
    config composed without this plugin's section."""
    section = getattr(getattr(cfg, "features", None), SECTION, None)
    return TensorBoardConfig() if section is None else section


def require_tensorboard() -> None:
    """`ConfigError` naming the pip command when ``features.tensorboard.enabled=true`` cannot
    write TensorBoard events (the tensorboard package is not installed)."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"features.tensorboard.enabled=true needs the tensorboard package "
                          f"({exc}): `pip install tensorboard`, or set "
                          f"features.tensorboard.enabled=false") from exc
