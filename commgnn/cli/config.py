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

from commgnn.config import from_dict, load_toml, replace_path, to_dict
from commgnn.data import DataConfig
from commgnn.dist.context import RuntimeConfig
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
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    output: OutputConfig = field(default_factory=OutputConfig)


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
    "patience": "train.patience",
    "seed": "train.seed",
    "timeout": "runtime.timeout_s",
    "threads": "runtime.threads",
    "port": "runtime.port",
    "backend": "runtime.backend",
    "out": "output.out",
    "quiet": "output.quiet",
}


def resolve_config(toml_path: str | None, flags: Mapping[str, Any],
                   env: Mapping[str, str]) -> RunConfig:
    """File (if any), then flags that were given, then ``COMMGNN_DATA_ROOT`` if no root is set."""
    cfg = from_dict(RunConfig, load_toml(toml_path)) if toml_path else RunConfig()
    for dest, key in FLAG_KEYS.items():
        value = flags.get(dest)
        if value is not None:
            cfg = replace_path(cfg, key, value)
    if cfg.data.root is None and env.get("COMMGNN_DATA_ROOT"):
        cfg = replace_path(cfg, "data.root", env["COMMGNN_DATA_ROOT"])
    return cfg


def config_dict(cfg: RunConfig) -> dict[str, Any]:
    return to_dict(cfg)
