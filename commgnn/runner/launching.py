"""Which launch a run takes: under ``torchrun`` when its variables are set
(:mod:`~commgnn.runner.torchrun`), else local ranks (:mod:`~commgnn.runner.local`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from torch import nn

from commgnn.distributed.context import launch_info_from_env
from commgnn.runner.config import RunConfig
from commgnn.runner.local import train_local
from commgnn.runner.torchrun import train_torchrun


def train_command(cfg: RunConfig, env: Mapping[str, str], *, resume: bool = False,
                  graph: Any = None, module: nn.Module | None = None) -> dict[str, Any] | None:
    """Train as ``cfg`` says: under torchrun when its variables are in ``env``, else with
    local ranks. Rank 0 (and the local launcher) returns the summary, other ranks None."""
    if env.get("COMMGNN_ENERGY") == "0":  # e.g. CI: skip CodeCarbon's per-rank start-up
        cfg = replace(cfg, energy=replace(cfg.energy, track=False))
    info = launch_info_from_env(env)
    if info is not None:
        return train_torchrun(cfg, info, graph, module)
    return train_local(cfg, resume=resume, graph=graph, module=module)
