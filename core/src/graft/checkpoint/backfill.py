"""The core's ``graft_ckpt_load``: give parameters without saved optimizer state fresh defaults.

A parameter that never received a gradient (DeepSeek-V4's indexer, an unused head) has no Adam
state, so a flattened optimizer checkpoint lacks its entries and loading it would fail on
``step``. Keeping the fresh optimizer's entries for exactly those keys (everything else is read
from the checkpoint) resumes such parameters as a new AdamW would start them. No collective is
needed. Registered as a built-in plugin, asked last (after plugins that rename entries); torch
is not imported here.
"""

from __future__ import annotations

import logging
from typing import Any

from graft.hookspecs import hookimpl

logger = logging.getLogger("graft.checkpoint")
SHOWN = 5


def parameter_of(key: str) -> str:
    """``state.<fqn>.<name>`` -> ``<fqn>``."""
    return key.removeprefix("state.").rsplit(".", 1)[0]


@hookimpl(trylast=True)
def graft_ckpt_load(state: dict[str, Any], ctx: Any) -> None:
    """Keep the fresh optimizer entries the checkpoint lacks (``ctx.keep_fresh``).

    Only once the model itself matches the checkpoint: a model of another shape also lacks
    optimizer state, and that mismatch is the error to report (`CheckpointError`), not a
    backfill."""
    optim = state.get("optim")
    if optim is None:
        return
    missing = [k for k in optim if f"optim.{k}" not in ctx.checkpoint_keys
               and f"optim.{k}" not in ctx.keep_fresh]
    if missing and state.get("model"):
        _check_model(state, ctx)
    ctx.keep_fresh.update(f"optim.{k}" for k in missing)
    ctx.backfilled = missing
    params = sorted({parameter_of(k) for k in missing if k.startswith("state.")})
    if params:
        shown = ", ".join(params[:SHOWN]) + (", ..." if len(params) > SHOWN else "")
        logger.info("checkpoint %s: %d parameters had no optimizer state (never received a "
                    "gradient); backfilled with fresh AdamW state: %s", ctx.path.name,
                    len(params), shown)


def _check_model(state: dict[str, Any], ctx: Any) -> None:
    """`CheckpointError` when the model's entries do not match the checkpoint's (names, shapes)."""
    from graft.checkpoint.manager import check_compatible
    from graft.checkpoint.safe_io import read_metadata

    saved = read_metadata(ctx.path).state_dict_metadata
    check_compatible(ctx.path, saved, {"model": state["model"]}, keep_fresh=ctx.keep_fresh)
