"""A run's configuration: every component's config under one TOML file.

Sections map one to one onto the components' frozen configs, strictly (unknown keys and
wrong types are errors)::

    [data]       commgnn.data.DataConfig        ([data.synthetic] SyntheticConfig)
    [partition]  commgnn.partition.PartitionConfig
    [model]      commgnn.models.ModelConfig
    [train]      commgnn.trainers.TrainConfig
    [runtime]    commgnn.distributed.RuntimeConfig
    [minibatch]  commgnn.sampling.SamplerConfig   (train.mode = "minibatch")
    [fetch]      commgnn.fetch.config.FetchConfig
    [output]     OutputConfig

CLI flags override the file; each flag names the key it sets (:data:`FLAG_KEYS`). The file
is checked on its own first (unknown keys, wrong types), so a flag cannot hide a mistake in it.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, get_args

from commgnn.comm.config import CommConfig
from commgnn.config import from_dict, load_checked_toml, replace_path, set_path, to_dict
from commgnn.data import DataConfig
from commgnn.distributed.context import RuntimeConfig
from commgnn.distributed.faults import FaultConfig
from commgnn.errors import ConfigError, PartitionError
from commgnn.fetch.config import FetchConfig
from commgnn.metrics.energy import EnergyConfig
from commgnn.sampling.config import SamplerConfig
from commgnn.models import ModelConfig
from commgnn.models.deep import MINIBATCH_REFUSED, PRECOMPUTE_REFUSED
from commgnn.models.net import MATCHED_REFUSED_FOR_GAT
from commgnn.partition import PartitionConfig, load_meta
from commgnn.trainers import TrainConfig


@dataclass(frozen=True, kw_only=True)
class OutputConfig:
    """Where and how a run reports."""

    out: str | None = None
    """Run directory; None = a new dated folder under ``runs/``."""
    quiet: bool = False
    """No progress bar or summary table (the files are written all the same)."""
    embeddings_layer: int | None = None
    """Also write ``embeddings.pt``: the ``[N, d]`` output of this layer (0-based, after its
    activation) for every node, from the best validation epoch's weights; None = no."""

    def __post_init__(self) -> None:
        if self.embeddings_layer is not None and self.embeddings_layer < 0:
            raise ConfigError(f"output.embeddings_layer must be >= 0, got {self.embeddings_layer}")


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything one ``commgnn train`` needs."""

    data: DataConfig = field(default_factory=DataConfig)
    """``[data]``: which graph and how it is split."""
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    """``[partition]``: partitioner, objective, seed, or a saved directory; node reorder."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """``[model]``: architecture."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """``[train]``: optimisation and early stopping."""
    comm: CommConfig = field(default_factory=CommConfig)
    """``[comm]``: communication levers (``[comm.halo]``)."""
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    """``[runtime]``: ranks, backend, devices, time-outs, threads."""
    minibatch: SamplerConfig = field(default_factory=SamplerConfig)
    """``[minibatch]``: the sampler of ``train.mode = "minibatch"``."""
    fetch: FetchConfig = field(default_factory=FetchConfig)
    """``[fetch]``: remote feature rows in mini-batch training (codec, cache, prefetch)."""
    energy: EnergyConfig = field(default_factory=EnergyConfig)
    """``[energy]``: CPU/RAM energy (CodeCarbon, offline) and the network's J per byte."""
    output: OutputConfig = field(default_factory=OutputConfig)
    """``[output]``: run directory, console output, embeddings."""
    fault: FaultConfig | None = None
    """``[fault]``: a failure injected on purpose, for testing failure handling (none by default)."""

    def __post_init__(self) -> None:
        k = self.output.embeddings_layer
        if k is not None and k >= self.model.layers:
            raise ConfigError(f"output.embeddings_layer = {k} but the model has {self.model.layers} layers "
                              f"(0 to {self.model.layers - 1})")
        if self.train.mode == "minibatch":
            self._check_minibatch()
        halo = self.comm.halo
        if self.model.residual != "none" and halo.precompute:
            raise ConfigError(PRECOMPUTE_REFUSED)
        if self.model.name == "gat" and halo.precompute_dropout == "matched":
            raise ConfigError(MATCHED_REFUSED_FOR_GAT)
        if self.model.act == "maxk" and halo.staleness.mode != "none":
            raise ConfigError("model.activation = 'maxk' sends halo rows as (index, value) pairs, which do not "
                              "yet combine with comm.halo.staleness; drop one of them")
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


    @property
    def effective_runtime(self) -> RuntimeConfig:
        """``runtime`` as the ranks use it: mini-batch training runs on the CPU, so there
        ``device = "auto"`` (which would pick CUDA on a GPU host) means ``"cpu"``. The
        config itself keeps ``auto``, so that it means the same in any other mode."""
        if self.train.mode == "minibatch" and self.runtime.device == "auto":
            return replace(self.runtime, device="cpu")
        return self.runtime

    def _check_minibatch(self) -> None:
        mb = self.minibatch
        if self.model.residual != "none":
            raise ConfigError(MINIBATCH_REFUSED)
        if self.model.name != "sage":
            raise ConfigError(f"sampler '{mb.sampler}' does not fit model '{self.model.name}': mini-batch training "
                              f"runs GraphSAGE (model.name = 'sage')")
        if mb.sampler == "vrgcn" and self.model.layers < 2:
            raise ConfigError("sampler 'vrgcn' needs model.layers >= 2: its first layer's aggregate is exact "
                              "(precomputed), and the history's control variate acts on the layers above it")
        if mb.sampler in ("neighbor", "vrgcn") and len(mb.fanout) != self.model.layers:
            raise ConfigError(f"minibatch.fanout has {len(mb.fanout)} entries ({','.join(map(str, mb.fanout))}) but "
                              f"the model has {self.model.layers} layers: give one fan-out per layer")
        if self.partition.reorder != "none":
            raise ConfigError(f"partition.reorder = '{self.partition.reorder}' renumbers full-graph partitions; "
                              f"mini-batch sampling needs them in ascending global id: drop it (reorder = 'none')")
        if mb.sampler == "cluster" and self.fetch.cached:
            raise ConfigError("sampler 'cluster' trains on each rank's own nodes and fetches no remote rows: "
                              "there is nothing to cache; drop fetch.cache_mb / fetch.cache_ratio")
        if self.runtime.device == "cuda":
            raise ConfigError("train.mode = 'minibatch' runs on the CPU (gloo) for now: its samplers, feature "
                              "fetch and cache build CPU tensors; drop runtime.device = 'cuda' (or train full-graph)")
        from commgnn.comm.config import HaloConfig

        # sparse_setup applies (VR-GCN's input aggregate is a one-time set-up exchange)
        if replace(self.comm.halo, sparse_setup=True) != HaloConfig():
            raise ConfigError("[comm.halo] levers act on full-graph training; in train.mode = 'minibatch' remote "
                              "rows travel through [fetch] (bits, cache)")


# flag name (argparse dest) -> dotted config key
FLAG_KEYS: dict[str, str] = {
    "dataset": "data.dataset",
    "data_root": "data.root",
    "model": "model.name",
    "layers": "model.layers",
    "hidden": "model.hidden",
    "dropout": "model.dropout",
    "heads": "model.heads",
    "activation": "model.activation",
    "maxk_k": "model.maxk_k",
    "residual": "model.residual",
    "checkpoint_activations": "model.checkpoint",
    "parts": "runtime.parts",
    "partitioner": "partition.method",
    "objective": "partition.objective",
    "partition_dir": "partition.dir",
    "place_hosts": "partition.hosts",
    "reorder": "partition.reorder",
    "partition_memory_gb": "partition.memory_limit_gb",
    "epochs": "train.epochs",
    "lr": "train.lr",
    "optimizer": "train.optimizer",
    "kernel": "train.kernel",
    "schedule": "train.schedule",
    "normalize_features": "data.normalize_features",
    "patience": "train.patience",
    "seed": "train.seed",
    "timeout": "runtime.timeout_s",
    "threads": "runtime.threads",
    "port": "runtime.port",
    "backend": "runtime.backend",
    "out": "output.out",
    "checkpoint_every": "runtime.checkpoint_every",
    "gc_freeze": "runtime.gc_freeze",
    "embeddings_layer": "output.embeddings_layer",
    "memory_limit_gb": "runtime.memory_limit_gb",
    "force": "runtime.force",
    "quiet": "output.quiet",
    "precompute": "comm.halo.precompute",
    "precompute_dropout": "comm.halo.precompute_dropout",
    "transform_first": "comm.halo.transform_first",
    "bits": "comm.halo.bits",
    "budget_mb": "comm.halo.budget_mb",
    "adapt_every": "comm.halo.adapt_every",
    "budget_s": "comm.halo.budget_s",
    "sample_rate": "comm.halo.sample_rate",
    "staleness": "comm.halo.staleness.mode",
    "stale_threshold": "comm.halo.staleness.threshold",
    "max_age": "comm.halo.staleness.max_age",
    "max_error": "comm.halo.staleness.max_error",
    "exact_every": "comm.halo.exact_every",
    "grad": "comm.grad.strategy",
    "ratio": "comm.grad.ratio",
    "half": "comm.grad.half",
    "levels": "comm.grad.levels",
    "powersgd_rank": "comm.grad.rank",
    "grad_start": "comm.grad.start_iter",
    "gossip": "comm.gossip.topology",
    "gossip_method": "comm.gossip.method",
    "gossip_average_every": "comm.gossip.average_every",
    "mode": "train.mode",
    "sampler": "minibatch.sampler",
    "batch_size": "minibatch.batch_size",
    "fanout": "minibatch.fanout",
    "replace": "minibatch.replace",
    "topology": "minibatch.topology",
    "cache_mb": "fetch.cache_mb",
    "cache_ratio": "fetch.cache_ratio",
    "cache_policy": "fetch.cache_policy",
    "fetch_bits": "fetch.bits",
    "fetch_budget_mb": "fetch.budget_mb",
    "fetch_sparse": "fetch.sparse",
    "prefetch": "fetch.prefetch",
    "country": "energy.country_iso_code",
    "energy_track": "energy.track",
    "network_j_per_byte": "energy.network_j_per_byte",
}


def resolve_config(toml_path: str | None, flags: Mapping[str, Any],
                   env: Mapping[str, str]) -> RunConfig:
    """File (if any), then flags that were given, then ``COMMGNN_DATA_ROOT`` if no root is set.
    A mini-batch run that names no model (in neither) trains GraphSAGE, the model its
    samplers fit.

    The file alone must hold only known keys with values of the right types (an error names
    the file and the key), even where a flag then replaces the value; settings that only
    make sense together are validated once, after the flags are merged."""
    data: dict[str, Any] = {}
    if toml_path:
        data = load_checked_toml(RunConfig, toml_path)
    for dest, key in FLAG_KEYS.items():
        value = flags.get(dest)
        if value is not None:
            set_path(data, key, value)
    train, model = data.get("train", {}), data.get("model", {})
    if isinstance(train, dict) and train.get("mode") == "minibatch" and isinstance(model, dict) \
            and "name" not in model:
        # the samplers fit GraphSAGE only, so a mini-batch run that names no model gets it
        # (not the full-graph default, GCN, which it would then refuse)
        set_path(data, "model.name", "sage")
    cfg = from_dict(RunConfig, data)
    if cfg.data.root is None and env.get("COMMGNN_DATA_ROOT"):
        cfg = replace_path(cfg, "data.root", env["COMMGNN_DATA_ROOT"])
    return cfg



PARTITION_META_KEYS = ("method", "objective", "seed", "hosts")
"""``[partition]`` keys a saved partition directory's ``meta.json`` records."""


def config_from_partition_dir(cfg: RunConfig) -> RunConfig:
    """``cfg`` with ``partition.method``, ``objective`` and ``seed`` taken from the
    ``meta.json`` of ``partition.dir`` (when set), so that the run's manifest and resolved
    config describe the partition that was actually used, not the defaults or flags.

    Keys the directory does not record keep ``cfg``'s values. A directory that cannot be
    read, or records values this commgnn does not accept, is a :class:`PartitionError`.
    """
    pdir = cfg.partition.dir
    if not pdir:
        return cfg
    meta = load_meta(pdir)
    recorded = {k: meta[k] for k in PARTITION_META_KEYS if k in meta}
    try:
        part = from_dict(PartitionConfig, {**to_dict(cfg.partition), **recorded}, path="partition")
    except ConfigError as exc:
        raise PartitionError(f"{Path(pdir) / 'meta.json'} records an invalid partition setting ({exc}); "
                             f"re-run `commgnn partition`") from None
    return replace(cfg, partition=part)


def default_for_key(dotted: str) -> Any:
    """Default of config key ``a.b.c`` in a default :class:`RunConfig`.

    A table that is off by default (``comm.gossip``) answers with its own defaults; a value
    that ``__post_init__`` widens into a table (``comm.halo.bits = 32``) answers with the
    declared default, as it would be written in TOML.
    """
    obj: Any = RunConfig()
    cls: type = RunConfig
    *heads, leaf = dotted.split(".")
    for head in heads:
        hints = typing.get_type_hints(cls)
        if head not in hints:
            raise KeyError(dotted)
        value = getattr(obj, head)
        if value is None:  # an optional table: its defaults
            tables = [a for a in (hints[head], *get_args(hints[head])) if dataclasses.is_dataclass(a)]
            if not tables:
                raise KeyError(dotted)
            value = tables[0]()
        obj, cls = value, type(value)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if leaf not in fields:
        raise KeyError(dotted)
    value = getattr(obj, leaf)
    declared = fields[leaf].default
    if dataclasses.is_dataclass(value) and declared is not dataclasses.MISSING:
        return declared
    return value


def default_for(dest: str) -> Any:
    """Config default behind CLI flag ``dest`` (an argparse dest in :data:`FLAG_KEYS`)."""
    return default_for_key(FLAG_KEYS[dest])
