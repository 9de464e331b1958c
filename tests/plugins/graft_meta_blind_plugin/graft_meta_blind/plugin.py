"""The bug class the conformance kit's checkpoint leg must catch: ``graft_pre_shard`` changes
the weights only when they are real, so on a ``model.path`` run (meta parameters before the
shard and the broadcast fill) it silently does nothing, as graft-offload once did.

``features.meta_blind.mode``:

* ``scale``: multiply every policy weight by 1.5 when the weights are real, and report
  ``meta_blind/applied`` only then;
* ``scale_always_report``: the same, but report ``meta_blind/applied`` (0 or 1) on every run,
  so only the results (losses) tell the two runs apart;
* ``count``: report the number of policy parameters (``meta_blind/parameters``), which works
  on meta parameters too: a plugin the kit must pass.
"""

from __future__ import annotations

from dataclasses import dataclass

from graft import hookimpl
from graft.config import choice

# What this process's pre-shard did, for graft_step_end (which gets no config).
_REPORT: dict[str, float] = {}


@dataclass
class MetaBlindConfig:
    mode: str = choice("off", ("off", "scale", "scale_always_report", "count"))


@hookimpl
def graft_config_sections():
    return [("meta_blind", MetaBlindConfig)]


@hookimpl
def graft_pre_shard(model, cfg, role):
    mode = cfg.features.meta_blind.mode
    if mode == "off" or role != "policy":
        return
    params = list(model.parameters())
    if mode == "count":
        _REPORT["meta_blind/parameters"] = float(sum(p.numel() for p in params))
        return
    real = not any(p.is_meta for p in params)
    if real:
        import torch

        with torch.no_grad():
            for param in params:
                param.mul_(1.5)
    if real or mode == "scale_always_report":
        _REPORT["meta_blind/applied"] = float(real)


@hookimpl
def graft_step_end(metrics):
    metrics.update(_REPORT)
