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

Every leaf field is an option (:data:`RUN_OPTIONS`): a flag of ``commgnn train`` and a
keyword of ``commgnn.train``. Options override the file, which is checked on its own first
(unknown keys, wrong types), so a flag cannot hide a mistake in it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from commgnn.comm.config import CommConfig
from commgnn.config import deprecated_names, from_dict, set_path, to_dict
from commgnn.data import DataConfig
from commgnn.distributed.config import RuntimeConfig
from commgnn.distributed.config import FaultConfig
from commgnn.errors import ConfigError, PartitionError
from commgnn.fetch.config import FetchConfig
from commgnn.metrics.config import EnergyConfig
from commgnn.sampling.config import SamplerConfig
from commgnn.models import ModelConfig
from commgnn.models.deep import MINIBATCH_REFUSED, PRECOMPUTE_REFUSED
from commgnn.models.net import MATCHED_REFUSED_FOR_GAT
from commgnn.partition import PartitionConfig, load_meta
from commgnn.options import OptionSet, opt
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
    predictions: bool = True
    """Write ``predictions.pt``, the ``[N, C]`` float32 class scores of every node (rank 0
    holds them all while it writes: 69 GB at papers100M's shape, so such a run sets it
    false; ``commgnn predict`` scores a finished run later)."""

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


def _bits(text: str) -> Any:
    """``8`` -> 8, ``4,8`` -> {forward: 4, backward: 8}, ``adaptive`` -> "adaptive"."""
    if text == "adaptive":
        return text
    try:
        parts = [int(p) for p in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N, FWD,BWD or 'adaptive', got {text!r}") from None
    if len(parts) == 1:
        return parts[0]
    if len(parts) == 2:
        return {"forward": parts[0], "backward": parts[1]}
    raise argparse.ArgumentTypeError(f"expected N, FWD,BWD or 'adaptive', got {text!r}")


def _fanout(text: str) -> list[int]:
    """``15,10`` -> [15, 10] (hop 1 first)."""
    try:
        return [int(p) for p in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 15,10, got {text!r}") from None


def _fetch_bits(text: str) -> Any:
    """``4`` -> 4, ``adaptive`` -> "adaptive"."""
    if text == "adaptive":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 1, 2, 4, 8, 32 or 'adaptive', got {text!r}") from None


DATA_OPTIONS = (
    opt("data.dataset", "--dataset", "'synthetic', a dataset name (see `commgnn datasets`), a .pt graph, a graph folder "
        "of .npy files or an OGB raw folder"),
    opt("data.root", "--data-root", "folder with staged datasets (default: $COMMGNN_DATA_ROOT, else PyG downloads)"),
    opt("data.normalize_features", "--normalize-features", "scale each feature row to sum 1 (PyG's NormalizeFeatures)",
        const=True),
)
"""``[data]`` options with flags of their own (``commgnn train``, ``partition`` and ``plan``)."""

PARTITION_OPTIONS = (
    opt("runtime.parts", "--parts", "number of partitions / ranks P"),
    opt("partition.method", "--partitioner", "metis | lp-metis (out of core: label propagation, then METIS on the clusters) | ldg (streaming, "
        "about half METIS's memory) | random | contiguous"),
    opt("partition.memory_limit_gb", "--partition-memory-gb",
        "refuse to partition above this estimated peak, naming a leaner partitioner (0 = available memory)"),
    opt("partition.objective", "--objective", "METIS objective: cut | vol"),
    opt("partition.features", "--partition-features", "graph folders: copy | source (rank folders read the "
        "feature rows from the graph's x.npy by id: no copy on disk)", choices=("copy", "source")),
    opt("partition.hosts", "--place-hosts", "place partitions on H hosts of P/H ranks, heaviest halo pairs together"),
)
"""The options ``commgnn partition`` shares with ``commgnn train``."""

RUN_OPTIONS = OptionSet("run", lambda: RunConfig, (
    *DATA_OPTIONS, *PARTITION_OPTIONS,
    opt("partition.seed", "--partition-seed", "partitioner seed"),
    opt("partition.dir", "--partition-dir", "use a saved partition directory (default: none, partition in memory)"),
    opt("partition.reorder", "--reorder", "renumber each rank's nodes for cache locality of the aggregation "
        "(full-graph mode; same results): none | degree | rcm | metis", choices=("none", "degree", "rcm", "metis")),
    opt("model.name", "--model", "gcn | sage | gat"),
    opt("model.layers", "--layers", "message-passing layers"),
    opt("model.hidden", "--hidden", "hidden width"),
    opt("model.dropout", "--dropout", "dropout rate"),
    opt("model.heads", "--heads", "GAT heads"),
    opt("model.activation", "--activation", "auto | relu | elu | maxk (MaxK-GNN: k largest per row)"),
    opt("model.maxk_k", "--maxk-k", "maxk: entries kept per row"),
    opt("model.residual", "--residual", "none | res+ (DeeperGCN pre-activation residual blocks, LayerNorm; "
        "--layers counts the blocks)", choices=("none", "res+")),
    opt("model.norm", "--norm", "none | layer (LayerNorm of each hidden row before the activation, as "
        "BNS-GCN's default)", choices=("none", "layer")),
    opt("model.checkpoint", "--checkpoint-activations",
        "res+: recompute each block in the backward pass (less memory, same numbers)", const=True),
    opt("train.epochs", "--epochs", "maximum epochs", resume=True),
    opt("train.lr", "--lr", "learning rate"),
    opt("train.optimizer", "--optimizer", "adam | sgd (with momentum 0.9)"),
    opt("train.kernel", "--kernel", "CPU aggregation kernels: auto | torch | numba (fused; auto = numba when installed)"),
    opt("train.schedule", "--schedule", "learning-rate schedule: constant | cosine"),
    opt("train.patience", "--patience", "early-stopping patience in epochs (0 = off)"),
    opt("train.seed", "--seed", "training seed"),
    opt("train.mode", "--mode", "fullgraph | minibatch"),
    opt("runtime.timeout_s", "--timeout", "collective time-out in seconds", resume=True),
    opt("runtime.threads", "--threads", "intra-op threads per rank (0 = cores / local ranks)", resume=True),
    opt("runtime.port", "--port", "rendezvous port for local ranks (0 = pick a free one)", resume=True),
    opt("runtime.backend", "--backend", "auto | gloo | nccl"),
    opt("runtime.checkpoint_every", "--checkpoint-every", "write an atomic checkpoint every k epochs (0 = never)",
        resume=True),
    opt("runtime.split_wait", "--split-wait", "time each halo exchange's wait for the last rank apart from its "
        "transfer (one barrier before it, counted as wait)", const=True),
    opt("runtime.gc_freeze", "--gc-freeze", "keep the heap held at the first epoch out of Python's full garbage "
        "collections during the epochs", negatable=True, resume=True),
    opt("runtime.memory_limit_gb", "--memory-limit-gb",
        "refuse a job whose estimated memory exceeds this (0 = available memory)", resume=True),
    opt("runtime.force", "--force", "start more than 8 local ranks per core", const=True, resume=True),
    opt("output.out", "--out", "run directory (default: runs/<date>-<dataset>-<model>-p<P>)"),
    opt("output.embeddings_layer", "--embeddings-layer",
        "also write embeddings.pt: every node's output of this layer (0-based)"),
    opt("output.predictions", "--no-predictions", "do not write predictions.pt (the [N, C] scores of every node, "
        "held on rank 0)", dest="predictions", const=False),
    opt("output.quiet", "--quiet", "no progress bar or table", const=True, resume=True),
    opt("comm.halo.precompute", "--precompute", "aggregate the input features once (no per-epoch input exchange)",
        const=True),
    opt("comm.halo.precompute_dropout", "--precompute-dropout",
        "precompute: dropout on the aggregate, or noise matched to the exact model's", choices=("aggregate", "matched")),
    opt("comm.halo.transform_first", "--transform-first", "send W h instead of h where narrower", const=True),
    opt("comm.halo.bits", "--bits", "quantization: 1|2|4|8|32, FWD,BWD (e.g. 4,8) or adaptive", parse=_bits),
    opt("comm.halo.budget_mb", "--budget-mb", "adaptive bits: MB per rank per epoch"),
    opt("comm.halo.adapt_every", "--adapt-every", "adaptive bits: re-solve the widths every k epochs"),
    opt("comm.halo.budget_s", "--budget-s", "adaptive bits: halo exchange seconds per rank per epoch (a time budget)"),
    opt("comm.halo.sample_rate", "--sample-rate", "fraction of boundary rows sent"),
    opt("comm.halo.staleness.mode", "--staleness", "none | pipeline | skip"),
    opt("comm.halo.staleness.threshold", "--stale-threshold", "skip: relative change to resend"),
    opt("comm.halo.staleness.max_age", "--max-age", "skip: oldest a cached row may be (epochs)"),
    opt("comm.halo.staleness.max_error", "--max-error",
        "pipeline: run the next epoch exact when stale rows were off by more than this (relative)"),
    opt("comm.halo.exact_every", "--exact-every", "exact refresh every k epochs (0 = never)"),
    opt("comm.grad.strategy", "--grad", "allreduce | fp16 | bf16 | powersgd | localsgd | topk | cltk | qsgd | signsgd"),
    opt("comm.grad.ratio", "--ratio", "topk, cltk: fraction of entries sent"),
    opt("comm.grad.half", "--half", "powersgd, cltk: values travel in fp16", const=True),
    opt("comm.grad.levels", "--levels", "qsgd: quantization levels"),
    opt("comm.grad.rank", "--powersgd-rank", "powersgd: approximation rank"),
    opt("comm.grad.start_iter", "--grad-start", "powersgd, localsgd: plain all-reduce steps first (>= 2)"),
    opt("comm.gossip.topology", "--gossip", "decentralised averaging instead of all-reduce: ring | torus | "
        "exponential | full | a graph file (default: none, gradients are all-reduced)"),
    opt("comm.gossip.method", "--gossip-method", "with --gossip: dpsgd | dpsgd-atc | pushsum | tracking | tracking-atc"),
    opt("comm.gossip.average_every", "--gossip-average-every",
        "dpsgd: exact model average every k rounds instead of gossip (Gossip-PGA)"),
    opt("minibatch.sampler", "--sampler", "neighbor | cluster | saint-node | saint-edge | saint-rw | vrgcn"),
    opt("minibatch.fanout", "--fanout", "neighbours per layer, hop 1 first, e.g. 15,10 (-1 = all)", parse=_fanout),
    opt("minibatch.batch_size", "--batch-size", "seed nodes per batch (largest rank)"),
    opt("minibatch.replace", "--replace", "sample neighbours with replacement", const=True),
    opt("minibatch.topology", "--topology", "auto | replicated | partitioned (owners sample their own nodes)"),
    opt("minibatch.inference", "--inference", "evaluation and predict: auto | full | layerwise (exact, by chunks) | "
        "sampled (evaluation scores the splits' nodes by neighbour sampling; predictions stay exact)",
        choices=("auto", "full", "layerwise", "sampled")),
    opt("minibatch.eval_nodes", "--eval-nodes",
        "with --inference sampled: score at most this many nodes of each split (0 = all)"),
    opt("fetch.cache_mb", "--cache-mb", "remote-row cache per rank in MB"),
    opt("fetch.cache_ratio", "--cache-ratio", "remote-row cache per rank as a fraction of its remote rows"),
    opt("fetch.cache_policy", "--cache-policy", "degree | presample | lru"),
    opt("fetch.bits", "--fetch-bits", "bits of fetched rows: 1|2|4|8|32 or adaptive (with --fetch-budget-mb)",
        parse=_fetch_bits),
    opt("fetch.budget_mb", "--fetch-budget-mb", "adaptive fetch bits: MB of rows each rank may receive per epoch"),
    opt("fetch.sparse", "--fetch-sparse",
        "fetched rows as lossless index lists / bitmaps (one more all-to-all per step)", const=True),
    opt("fetch.prefetch", "--prefetch", "sample and fetch the next batch while the current one computes", const=True),
    opt("energy.country_iso_code", "--country", "ISO 3166-1 alpha-3 code of where the run's machines are (grid CO2)"),
    opt("energy.track", "--no-energy", "do not measure CPU/RAM energy (set COMMGNN_ENERGY=0 for the same)",
        dest="energy_track", const=False),
    opt("energy.network_j_per_byte", "--network-j-per-byte", "joules per byte sent between ranks (network energy model)"),
), prefixes={"data.synthetic": "synthetic_", "comm.grad": "grad_", "comm.gossip": "gossip_",
             "comm.halo.staleness": "staleness_", "minibatch.saint": "saint_", "energy": "energy_",
             "fault": "fault_"},
    groups={"comm": 2})
"""Every option of a run (``commgnn train``, ``commgnn.train``): the table above gives the
flags kept from earlier releases their names and short help; each other ``[table]`` field
is an option named after it (``train.weight_decay``: ``--weight-decay``, ``weight_decay=``;
``comm.grad.momentum``: ``--grad-momentum``; ``fault.at``: ``--fault-at``)."""


__getattr__ = deprecated_names(__name__, {"FLAG_KEYS": (lambda: RUN_OPTIONS.flag_keys, "RUN_OPTIONS.flag_keys")})
"""``FLAG_KEYS`` (``{argparse dest: dotted key}``), derived from :data:`RUN_OPTIONS`: deprecated."""


def resolve_config(toml_path: str | None, flags: Mapping[str, Any],
                   env: Mapping[str, str], *, start: RunConfig | None = None) -> RunConfig:
    """File (if any; or the config ``start``), then flags that were given (``{dest: value}``,
    :data:`RUN_OPTIONS`), then ``COMMGNN_DATA_ROOT`` if no root is set. A mini-batch run
    that names no model (in neither) trains GraphSAGE, the model its samplers fit.

    The file alone must hold only known keys with values of the right types (an error names
    the file and the key), even where a flag then replaces the value; settings that only
    make sense together are validated once, after the flags are merged."""
    RUN_OPTIONS.unknown(list(flags), "the flags of `commgnn train`")

    def sage_for_minibatch(data: dict[str, Any]) -> None:
        train, model = data.get("train", {}), data.get("model", {})
        if isinstance(train, dict) and train.get("mode") == "minibatch" and isinstance(model, dict) \
                and "name" not in model and start is None:
            # the samplers fit GraphSAGE only, so a mini-batch run that names no model gets it
            # (not the full-graph default, GCN, which it would then refuse)
            set_path(data, "model.name", "sage")

    return RUN_OPTIONS.resolve(toml_path, flags, env, start=start, adjust=sage_for_minibatch)  # type: ignore[no-any-return]


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
