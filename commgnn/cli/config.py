"""A run's configuration: every component's config under one TOML file.

Sections map one to one onto the components' frozen configs, strictly (unknown keys and
wrong types are errors)::

    [data]       commgnn.data.DataConfig        ([data.synthetic] SyntheticConfig)
    [partition]  commgnn.partition.PartitionConfig
    [model]      commgnn.models.ModelConfig
    [train]      commgnn.trainers.TrainConfig
    [runtime]    commgnn.dist.RuntimeConfig
    [output]     OutputConfig

CLI flags override the file; each flag names the key it sets (:data:`FLAG_KEYS`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from commgnn.comm.config import CommConfig
from commgnn.config import from_dict, load_toml, replace_path, set_path
from commgnn.data import DataConfig
from commgnn.dist.context import RuntimeConfig
from commgnn.errors import ConfigError
from commgnn.models import ModelConfig
from commgnn.partition import PartitionConfig
from commgnn.trainers import TrainConfig


@dataclass(frozen=True, kw_only=True)
class OutputConfig:
    """Where and how a run reports."""

    out: str | None = None
    """Run directory; None = a new dated folder under ``runs/``."""
    quiet: bool = False
    """No progress bar or summary table (the files are written all the same)."""


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything one ``commgnn train`` needs."""

    data: DataConfig = field(default_factory=DataConfig)
    """``[data]``: which graph and how it is split."""
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    """``[partition]``: partitioner, objective, seed, or a saved directory."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """``[model]``: architecture."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """``[train]``: optimisation and early stopping."""
    comm: CommConfig = field(default_factory=CommConfig)
    """``[comm]``: communication levers (``[comm.halo]``)."""
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    """``[runtime]``: ranks, backend, devices, time-outs, threads."""
    output: OutputConfig = field(default_factory=OutputConfig)
    """``[output]``: run directory and console output."""

    def __post_init__(self) -> None:
        # A strategy that owns the momentum (DGC's momentum correction, QG-DSGDm) replaces
        # SGD's heavy ball; under Adam it would stack a second, unrelated momentum on top.
        gossip = self.comm.gossip
        if gossip is not None:
            owner = "comm.gossip.momentum" if gossip.momentum else None
        else:
            grad = self.comm.grad
            owner = "comm.grad.momentum" if grad.momentum and grad.strategy in ("topk", "cltk") else None
        if owner and self.train.optimizer != "sgd":
            raise ConfigError(f"{owner} moves SGD's momentum into the communication strategy; it needs "
                              f"train.optimizer = 'sgd', not '{self.train.optimizer}'")


# flag name (argparse dest) -> dotted config key
FLAG_KEYS: dict[str, str] = {
    "dataset": "data.dataset",
    "data_root": "data.root",
    "model": "model.name",
    "layers": "model.layers",
    "hidden": "model.hidden",
    "dropout": "model.dropout",
    "heads": "model.heads",
    "parts": "runtime.parts",
    "partitioner": "partition.method",
    "objective": "partition.objective",
    "partition_dir": "partition.dir",
    "epochs": "train.epochs",
    "lr": "train.lr",
    "optimizer": "train.optimizer",
    "schedule": "train.schedule",
    "normalize_features": "data.normalize_features",
    "patience": "train.patience",
    "seed": "train.seed",
    "timeout": "runtime.timeout_s",
    "threads": "runtime.threads",
    "port": "runtime.port",
    "backend": "runtime.backend",
    "out": "output.out",
    "quiet": "output.quiet",
    "precompute": "comm.halo.precompute",
    "transform_first": "comm.halo.transform_first",
    "bits": "comm.halo.bits",
    "budget_mb": "comm.halo.budget_mb",
    "sample_rate": "comm.halo.sample_rate",
    "staleness": "comm.halo.staleness.mode",
    "stale_threshold": "comm.halo.staleness.threshold",
    "max_age": "comm.halo.staleness.max_age",
    "exact_every": "comm.halo.exact_every",
    "grad": "comm.grad.strategy",
    "ratio": "comm.grad.ratio",
    "half": "comm.grad.half",
    "levels": "comm.grad.levels",
    "powersgd_rank": "comm.grad.rank",
    "gossip": "comm.gossip.topology",
    "gossip_method": "comm.gossip.method",
    "gossip_average_every": "comm.gossip.average_every",
}


def resolve_config(toml_path: str | None, flags: Mapping[str, Any],
                   env: Mapping[str, str]) -> RunConfig:
    """File (if any), then flags that were given, then ``COMMGNN_DATA_ROOT`` if no root is set."""
    data = load_toml(toml_path) if toml_path else {}
    for dest, key in FLAG_KEYS.items():
        value = flags.get(dest)
        if value is not None:
            set_path(data, key, value)
    cfg = from_dict(RunConfig, data)
    if cfg.data.root is None and env.get("COMMGNN_DATA_ROOT"):
        cfg = replace_path(cfg, "data.root", env["COMMGNN_DATA_ROOT"])
    return cfg

