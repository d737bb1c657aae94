"""``commgnn federate``'s configuration: one frozen table per concern.

A federated run's TOML::

    [data]        dataset, root, train_ratio, ...      (commgnn.data.DataConfig)
    [split]       method, clients, alpha, path, seed   (federated.splits.SplitConfig)
    [federated]   algorithm, rounds, local_epochs, ... (FedConfig below)
    [uplink]      codec, bits, fraction, rank, clip    (UplinkConfig below)
    [secagg]      enabled, threshold, ring_bits, ...   (federated.secagg.SecAggConfig)
    [dp]          epsilon, delta, clip, noise_at, ...  (federated.dp.DPConfig)
    [policy]      path                                 (a governance policy TOML)
    [output]      out
    [runtime]     parts, timeout_s, ...                (commgnn.distributed.context.RuntimeConfig)

Unknown keys are errors (:func:`commgnn.config.from_dict`); the resolved config is
written beside the results as ``config.toml``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from commgnn.config import fraction, positive
from commgnn.data.config import DataConfig
from commgnn.distributed.context import RuntimeConfig
from commgnn.errors import ConfigError
from commgnn.federated.dp import DPConfig
from commgnn.federated.neighgen import NeighGenConfig
from commgnn.federated.secagg.config import SecAggConfig
from commgnn.federated.splits import SplitConfig

Algorithm = Literal["fedavg", "fedprox", "local", "central"]


@dataclass(frozen=True, kw_only=True)
class FedConfig:
    """The federated algorithm, the clients' local training and the model."""

    algorithm: Algorithm = "fedavg"
    """``fedavg`` (McMahan et al. 2017), ``fedprox`` (FedAvg plus the proximal term
    ``mu/2 ||w - w_global||^2``, Li et al. 2020), ``local`` (each client trains alone, no
    communication: the lower anchor) or ``central`` (one party holds the whole graph: the
    upper anchor; the split only groups the fairness report)."""
    rounds: int = 100
    """Communication rounds R (for ``local``/``central``: R x local_epochs steps in all)."""
    local_epochs: int = 4
    """Full-batch steps each participating client takes on its subgraph per round."""
    lr: float = 0.25
    """Clients' SGD learning rate (FederatedScope-GNN's 0.25 for GCN)."""
    momentum: float = 0.0
    """Clients' SGD momentum (the buffer starts at zero every round: clients keep no
    optimiser state between rounds)."""
    weight_decay: float = 5e-4
    """Clients' L2 penalty."""
    server_lr: float = 1.0
    """The global model moves by ``server_lr`` times the aggregated update (1 = FedAvg)."""
    mu: float = 0.01
    """FedProx's proximal coefficient (only with ``fedprox``)."""
    participation: float = 1.0
    """Fraction q of the clients drawn (seeded, without replacement) each round; also the
    sample rate of the DP accountant."""
    hidden: int = 64
    """GCN hidden width (2 layers)."""
    dropout: float = 0.5
    """Dropout between the two layers, during local training."""
    weighting: Literal["samples", "uniform"] = "samples"
    """Average updates weighted by each client's training nodes (FedAvg) or uniformly.
    DP forces ``uniform``: a weight that depends on a client's data would change the
    sensitivity; so do robust aggregators (their bounds assume unweighted updates, and a
    forged sample count would buy a Byzantine client more say)."""
    aggregator: Literal["mean", "median", "trimmed_mean", "krum"] = "mean"
    """How the server combines updates: a (weighted) mean, or a Byzantine-robust rule. The
    robust rules see individual updates, so they cannot run under secure aggregation."""
    trim: float = 0.1
    """trimmed_mean: fraction of the largest and of the smallest values dropped per coordinate."""
    krum_f: int = 1
    """krum: the number f of Byzantine clients it tolerates (needs n > 2f + 2)."""
    byzantine: int = 0
    """Test harness: the first ``byzantine`` clients send forged updates (``attack``)."""
    attack: Literal["scale", "flip", "noise"] = "scale"
    """byzantine: ``scale`` sends -10 times the honest update, ``flip`` its negation,
    ``noise`` a N(0, 1) vector unrelated to training."""
    cross_edges: Literal["drop", "embeddings"] = "drop"
    """Edges between clients: ``drop`` them, or let each client receive, each round, its
    cross-client neighbours' embeddings for both layers (``x_u W1``, then ``h_u W2``) from
    their owners, protected (``embedding_bits`` and/or ``embedding_noise``) as the policy
    demands."""
    embedding_bits: int = 8
    """Bits per value of the embeddings that cross clients (32 = fp32)."""
    embedding_noise: float = 0.0
    """Std of the Gaussian noise added to each crossing embedding value (0 = none)."""
    masks: Literal["stratified", "dataset"] = "stratified"
    """``stratified``: a seeded 60/20/20 split per class (``data.train_ratio``,
    ``val_ratio``, ``split_seed``), FederatedScope-GNN's protocol; ``dataset``: the
    dataset's own masks (e.g. Planetoid's public split)."""
    eval_every: int = 1
    """Evaluate the global model every this many rounds (and after the last one)."""
    seed: int = 0
    """Seed of initialisation, dropout, participation draws, masks and noise."""

    def __post_init__(self) -> None:
        if self.algorithm not in ("fedavg", "fedprox", "local", "central"):
            raise ConfigError(f"federated.algorithm must be fedavg, fedprox, local or central, got {self.algorithm!r}")
        for name in ("rounds", "local_epochs", "hidden", "eval_every"):
            positive(f"federated.{name}", getattr(self, name))
        for name in ("lr", "server_lr"):
            positive(f"federated.{name}", getattr(self, name))
        for name in ("momentum", "weight_decay", "mu", "embedding_noise"):
            positive(f"federated.{name}", getattr(self, name), allow_zero=True)
        fraction("federated.participation", self.participation, open_low=True)
        fraction("federated.dropout", self.dropout, open_high=True)
        fraction("federated.trim", self.trim, open_high=True)
        positive("federated.krum_f", self.krum_f)
        positive("federated.seed", self.seed, allow_zero=True)
        if self.weighting not in ("samples", "uniform"):
            raise ConfigError(f"federated.weighting must be 'samples' or 'uniform', got {self.weighting!r}")
        if self.aggregator not in ("mean", "median", "trimmed_mean", "krum"):
            raise ConfigError(f"federated.aggregator must be mean, median, trimmed_mean or krum, "
                              f"got {self.aggregator!r}")
        positive("federated.byzantine", self.byzantine, allow_zero=True)
        if self.attack not in ("scale", "flip", "noise"):
            raise ConfigError(f"federated.attack must be scale, flip or noise, got {self.attack!r}")
        if self.cross_edges not in ("drop", "embeddings"):
            raise ConfigError(f"federated.cross_edges must be 'drop' or 'embeddings', got {self.cross_edges!r}")
        if self.masks not in ("stratified", "dataset"):
            raise ConfigError(f"federated.masks must be 'stratified' or 'dataset', got {self.masks!r}")
        if self.embedding_bits not in (1, 2, 4, 8, 32):
            raise ConfigError(f"federated.embedding_bits must be one of 1, 2, 4, 8 or 32, got {self.embedding_bits}")


@dataclass(frozen=True, kw_only=True)
class UplinkConfig:
    """How a client's update travels to the server."""

    codec: Literal["fp32", "quant", "randomk", "rank"] = "fp32"
    """``fp32`` (4 bytes a coordinate; with secure aggregation the fixed-point encoding of
    ``[secagg]``), ``quant`` (shared-scale ``bits``-bit integers), ``randomk`` (a random
    ``fraction`` of the coordinates, the same for every client each round, then
    quantised) or ``rank`` (rank-``rank`` projections of each weight matrix with a shared
    random basis, then quantised). All of them still sum under secure aggregation."""
    bits: int = 8
    """Bits per transmitted value of ``quant``/``randomk``/``rank`` (the ring adds
    ceil(log2 n) bits so that n clients' sums do not wrap)."""
    fraction: float = 0.05
    """randomk: share of the coordinates sent each round."""
    rank: int = 2
    """rank: columns of each shared projection."""
    clip: float = 0.0
    """Coordinates are clipped to [-clip, clip] before quantisation (the shared scale is
    clip / (2^(bits-1) - 1)); 0 = automatic: four times the largest coordinate of the
    previous round's aggregate (public to every party), at least 1e-3."""
    error_feedback: bool = True
    """randomk/rank: a client keeps what it did not send and adds it to its next update."""
    residual_decay: float = 1.0
    """randomk/rank with error feedback: the kept residual is multiplied by this each round,
    in (0, 1]; 1 = plain error feedback, 0.9 keeps about 10 rounds' worth (a damped residual
    does not pile up and overshoot when each round sends a small share of the update)."""

    def __post_init__(self) -> None:
        if self.codec not in ("fp32", "quant", "randomk", "rank"):
            raise ConfigError(f"uplink.codec must be fp32, quant, randomk or rank, got {self.codec!r}")
        if not isinstance(self.bits, int) or not 2 <= self.bits <= 32:
            raise ConfigError(f"uplink.bits must be an integer in [2, 32], got {self.bits!r}")
        fraction("uplink.fraction", self.fraction, open_low=True)
        positive("uplink.rank", self.rank)
        positive("uplink.clip", self.clip, allow_zero=True)
        if not (isinstance(self.residual_decay, (int, float)) and 0.0 < self.residual_decay <= 1.0):
            raise ConfigError(f"uplink.residual_decay must be in (0, 1] (1 = plain error feedback), "
                              f"got {self.residual_decay!r}")


@dataclass(frozen=True, kw_only=True)
class PolicyRef:
    """``[policy]``: the governance policy the exchange layer enforces."""

    path: str | None = None
    """A policy TOML (organisations, what may cross, byte budgets); None = no policy: every
    client is its own organisation and nothing is restricted (but every payload is still
    counted)."""


@dataclass(frozen=True, kw_only=True)
class FedOutput:
    """``[output]``."""

    out: str | None = None
    """Run folder (``summary.json``, ``metrics.jsonl``, ``fairness.md``, ``config.toml``);
    None = ``runs/federate-<dataset>-<algorithm>-<time>``."""
    quiet: bool = False
    """No per-round lines on stdout."""


@dataclass(frozen=True, kw_only=True)
class FedRuntimeConfig(RuntimeConfig):
    """``[runtime]`` of a federation: as ``commgnn train``'s, but one process by default."""

    parts: int = 1
    """Ranks W: 1 runs the server and every client in this process; W > 1 makes rank 0 the
    server and spreads the clients over ranks 1..W-1."""


@dataclass(frozen=True, kw_only=True)
class FederateConfig:
    """A whole ``commgnn federate`` run."""

    data: DataConfig = field(default_factory=DataConfig)
    """``[data]``: the graph the organisations hold between them."""
    split: SplitConfig = field(default_factory=SplitConfig)
    """``[split]``: how the graph is divided into clients (Louvain communities, METIS, Dirichlet label skew, a file)."""
    federated: FedConfig = field(default_factory=FedConfig)
    """``[federated]``: algorithm, rounds, local steps, participation, aggregator, cross-client edges."""
    uplink: UplinkConfig = field(default_factory=UplinkConfig)
    """``[uplink]``: how client updates travel to the server (fp32, quantized, random-k, low rank)."""
    secagg: SecAggConfig = field(default_factory=SecAggConfig)
    """``[secagg]``: secure aggregation (the server learns only the sum of the updates)."""
    dp: DPConfig = field(default_factory=DPConfig)
    """``[dp]``: client-level differential privacy (clipping, noise, accountant)."""
    neighgen: NeighGenConfig = field(default_factory=NeighGenConfig)
    """``[neighgen]``: generated missing neighbours that mend each client's subgraph."""
    policy: PolicyRef = field(default_factory=PolicyRef)
    """``[policy]``: the governance policy file (organisations, what may cross)."""
    output: FedOutput = field(default_factory=FedOutput)
    """``[output]``: run directory and console output."""
    runtime: FedRuntimeConfig = field(default_factory=FedRuntimeConfig)
    """``[runtime]``: ranks (1: server and clients in one process), backend, time-outs."""

    def __post_init__(self) -> None:
        fed = self.federated
        if self.secagg.enabled and fed.aggregator != "mean":
            raise ConfigError(f"federated.aggregator = {fed.aggregator!r} needs each client's update, which "
                              f"secure aggregation hides from the server; use aggregator = 'mean' or turn "
                              f"secagg off")
        if self.uplink.codec != "fp32" and fed.aggregator != "mean":
            raise ConfigError("a compressed uplink decodes only sums; robust aggregators need aggregator = 'mean' "
                              "with uplink.codec other than fp32")
        if fed.algorithm in ("local", "central") and (self.secagg.enabled or self.dp.enabled
                                                      or self.uplink.codec != "fp32"):
            raise ConfigError(f"federated.algorithm = {fed.algorithm!r} sends no updates: secagg, dp and "
                              f"uplink codecs apply to fedavg and fedprox only")
        if self.dp.enabled:
            if self.dp.noise_at == "clients" and not self.secagg.enabled:
                raise ConfigError("dp.noise_at = 'clients' protects only the sum, which the server sees alone "
                                  "under secure aggregation: add --secure-agg, or set dp.noise_at = 'server'")
            if fed.cross_edges == "embeddings":
                raise ConfigError("the embeddings clients exchange (cross_edges = 'embeddings', computed from their "
                                  "raw features and labels' training) are not covered by the DP accountant: "
                                  "set cross_edges = 'drop' with DP, or turn DP off")
            if self.uplink.codec in ("randomk", "rank") and self.uplink.error_feedback:
                raise ConfigError(f"uplink.codec = {self.uplink.codec!r} with error feedback re-sends earlier "
                                  f"(clipped, noised) updates, breaking the DP sensitivity bound: set "
                                  f"uplink.error_feedback = false or use codec 'quant' or 'fp32'")
        if self.neighgen.enabled:
            if fed.algorithm not in ("fedavg", "fedprox") or fed.cross_edges != "drop":
                raise ConfigError("neighgen mends the subgraphs that dropped cross-client edges before FedAvg "
                                  "or FedProx: it needs algorithm fedavg/fedprox and cross_edges = 'drop'")
            if self.dp.enabled:
                raise ConfigError("neighgen's generator rounds are not covered by the DP accountant: "
                                  "turn DP off or neighgen off")
        if fed.algorithm in ("central", "local") and fed.cross_edges != "drop":
            raise ConfigError(f"federated.algorithm = {fed.algorithm!r} exchanges nothing between clients; "
                              f"cross_edges = 'embeddings' applies to fedavg and fedprox")
