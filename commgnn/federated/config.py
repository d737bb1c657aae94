"""``commgnn federate``'s configuration: one frozen table per concern.

A federated run's TOML::

    [data]        dataset, root, train_ratio, ...      (commgnn.data.DataConfig)
    [split]       method, clients, alpha, path, seed   (SplitConfig below)
    [federated]   algorithm, rounds, local_epochs, ... (FedConfig below)
    [uplink]      codec, bits, fraction, rank, clip    (UplinkConfig below)
    [secagg]      enabled, threshold, ring_bits, ...   (SecAggConfig below)
    [dp]          epsilon, delta, clip, noise_at, ...  (DPConfig below)
    [policy]      path                                 (a governance policy TOML)
    [output]      out
    [runtime]     parts, timeout_s, ...                (commgnn.distributed.config.RuntimeConfig)

Every federated config table is defined here (``[neighgen]``'s too); the modules that use
them re-export them under their old import names (``federated.dp.DPConfig``,
``federated.secagg.config.SecAggConfig``,
``federated.neighgen.NeighGenConfig``).

Unknown keys are errors (:func:`commgnn.config.from_dict`); the resolved config is
written beside the results as ``config.toml``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, get_args

from commgnn.config import fraction, one_line, positive
from commgnn.data.config import DataConfig
from commgnn.distributed.config import RuntimeConfig
from commgnn.errors import ConfigError

Algorithm = Literal["fedavg", "fedprox", "local", "central"]

SplitMethod = Literal["louvain", "metis", "dirichlet", "file"]
"""How :func:`split_clients` assigns nodes to clients."""

FILE_SUFFIXES = (".npy", ".pt", ".csv")
"""Accepted extensions of a client map file."""


@dataclass(frozen=True, kw_only=True)
class SplitConfig:
    """How to split the graph into federated clients (see :func:`split_clients`)."""

    method: SplitMethod = "louvain"
    """``louvain`` (communities, balanced), ``metis`` (min-cut), ``dirichlet`` (label
    skew with concentration ``alpha``) or ``file`` (a node -> client map at ``path``)."""
    clients: int = 4
    """Number of clients K (at least 2, at most the number of nodes)."""
    alpha: float = 0.5
    """Dirichlet concentration of the ``dirichlet`` method (> 0): small values (0.1)
    give each client few classes, large ones (100) near-IID clients. Ignored otherwise."""
    path: str | None = None
    """The client map file of the ``file`` method: ``.npy`` / ``.pt`` with ``[N]``
    client ids, or ``.csv`` with ``node,client`` rows. Only allowed with ``file``."""
    seed: int = 0
    """Seed of Louvain, METIS and the Dirichlet draws; the same seed gives the same split."""

    def __post_init__(self) -> None:
        if self.method not in get_args(SplitMethod):
            choices = ", ".join(repr(m) for m in get_args(SplitMethod))
            raise ConfigError(f"method: {self.method!r} is not one of {choices}")
        if isinstance(self.clients, bool) or not isinstance(self.clients, int) or self.clients < 2:
            raise ConfigError(f"clients must be an int >= 2, got {self.clients!r:.40}")
        positive("alpha", self.alpha)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"seed must be an int >= 0, got {self.seed!r:.40}")
        if self.seed >= 2**63:  # METIS and torch take 64-bit seeds
            raise ConfigError(f"seed must be below 2**63, got {self.seed:.3e}")
        if self.method == "file":
            if not isinstance(self.path, str) or not self.path.strip():
                raise ConfigError("path: method 'file' needs path = a .npy, .pt or .csv file "
                                  "mapping each node to its client")
            if not self.path.lower().endswith(FILE_SUFFIXES):
                raise ConfigError(f"path must end in .npy, .pt or .csv, got {one_line(self.path)!r}")
        elif self.path is not None:
            raise ConfigError(f"path is only read with method = 'file' (method is "
                              f"{self.method!r}); remove path or set method = 'file'")


DEFAULT_DELTA = 1e-5
"""Default delta. The usual rule is delta << 1 / (number of protected units); with clients as
the unit and tens to thousands of clients, 1e-5 is comfortably below that. (A rule such as
1 / N^1.1 would give delta ~ 0.08 for 10 clients: far too weak.)"""

NoiseAt = Literal["server", "clients"]


@dataclass(frozen=True, kw_only=True)
class DPConfig:
    """Client-level differential privacy of the federated updates (off by default)."""

    epsilon: float = 0.0
    """Target epsilon over the whole run; 0 = DP off (unless ``noise_multiplier`` is set).
    The noise multiplier is then calibrated from it, the number of rounds and the
    participation rate (:func:`calibrate`)."""
    delta: float = DEFAULT_DELTA
    """Target delta; must be well below 1 / (number of clients). The default 1e-5 suits any
    federation of up to ~10^4 clients."""
    clip: float = 1.0
    """L2 bound C on one client's update per round (the sensitivity of the summed update);
    with ``adaptive_clip`` the initial value."""
    noise_multiplier: float = 0.0
    """sigma: the noise on the sum has std sigma * C. 0 = derived from ``epsilon``; set it
    (with ``epsilon = 0``) to fix the noise and only report the epsilon spent."""
    noise_at: NoiseAt = "clients"
    """``clients``: each of n participants adds N(0, (sigma C)^2 / n) to its clipped update,
    so the (securely) aggregated sum carries N(0, (sigma C)^2): distributed DP, the server
    never sees an un-noised sum. ``server``: the server adds N(0, (sigma C)^2) to the sum."""
    adaptive_clip: bool = False
    """Move C each round toward the ``target_quantile`` of the update norms (Andrew et al.
    2021), spending part of the noise on the released clipped-count."""
    target_quantile: float = 0.5
    """adaptive_clip: fraction gamma of updates that should be unclipped."""
    clip_lr: float = 0.2
    """adaptive_clip: geometric step size eta_C of the clip update."""
    count_stddev: float | None = None
    """adaptive_clip: std sigma_b of the noise on the clipped-count sum; None = participants /
    20, the paper's choice. Must exceed noise_multiplier / 2."""
    max_clip: float | None = None
    """adaptive_clip: the largest value C may reach; None = ``clip``. It sizes the fixed-point
    range of secure aggregation and of quantising uplinks (a value beyond the range would wrap
    in the ring), so start C where it should be at most and let it shrink, or raise this."""
    reproducible_noise: bool = False
    """Draw the DP noise from the run's seeded generators, so a run repeats bit for bit (tests,
    benchmarks). Not private: the seed is in ``config.toml``, and whoever holds it can regenerate
    the noise and subtract it. False (the default): every client and the server draw their
    noise from a generator seeded by ``secrets.randbits`` that nobody else sees."""

    def __post_init__(self) -> None:
        positive("epsilon", self.epsilon, allow_zero=True)
        positive("noise_multiplier", self.noise_multiplier, allow_zero=True)
        if self.epsilon > 0 and self.noise_multiplier > 0:
            raise ConfigError(f"noise_multiplier: set epsilon (noise calibrated to it) or noise_multiplier "
                              f"(epsilon reported), not both; got epsilon={self.epsilon}, "
                              f"noise_multiplier={self.noise_multiplier}")
        fraction("delta", self.delta, open_low=True, open_high=True)
        if self.enabled and self.delta > 0.01:
            raise ConfigError(f"delta must be well below 1 / (number of clients), e.g. 1e-5; got {self.delta}")
        positive("clip", self.clip)
        if self.noise_at not in ("server", "clients"):
            raise ConfigError(f"noise_at must be 'server' or 'clients', got {self.noise_at!r}")
        fraction("target_quantile", self.target_quantile, open_low=True, open_high=True)
        positive("clip_lr", self.clip_lr)
        if self.count_stddev is not None:
            positive("count_stddev", self.count_stddev)
            if not self.adaptive_clip:
                raise ConfigError("count_stddev is only used with adaptive_clip = true")
        if self.adaptive_clip and not self.enabled:
            raise ConfigError("adaptive_clip needs DP on: set epsilon or noise_multiplier")
        if self.max_clip is not None:
            if not self.adaptive_clip:
                raise ConfigError("max_clip is only used with adaptive_clip = true")
            if not self.max_clip >= self.clip:
                raise ConfigError(f"max_clip must be at least clip ({self.clip:g}), got {self.max_clip:g}")

    @property
    def clip_ceiling(self) -> float:
        """The largest clip a run may use: ``max_clip`` under adaptive clipping, else ``clip``."""
        return self.max_clip if self.max_clip is not None else self.clip

    @property
    def enabled(self) -> bool:
        """True when noise is added (a target epsilon or a fixed noise multiplier is set)."""
        return self.epsilon > 0 or self.noise_multiplier > 0


@dataclass(frozen=True, kw_only=True)
class SecAggConfig:
    """Secure aggregation: threshold, ring and fixed-point encoding."""

    enabled: bool = False
    """Mask every client update so the server learns only the sum of the survivors."""
    threshold: float = 2 / 3
    """Shamir threshold t: at least t clients must survive to the unmasking step, and
    fewer than t colluding clients (with the server) learn nothing about one update. A
    value <= 1 is a fraction of the clients (of a client's neighbourhood of
    ``neighbours + 1`` with SecAgg+), rounded up; a value > 1 is a client count (an
    integer). The default, ceil(2n/3), lets a third of the clients drop out. t must exceed
    half the group: with t <= n/2 a server that tells two halves different survivor sets
    could collect both a client's self-mask and its pairwise-mask shares. Against a server
    colluding with c clients the protocol needs 2t > n + c (Bonawitz et al. 2017), which
    the default meets for c < n/3."""
    ring_bits: int = 32
    """Bits m of the ring Z_{2^m} that masked sums live in (2 to 62)."""
    frac_bits: int = 16
    """Fractional bits of the fixed-point encoding (resolution 2^-frac_bits)."""
    clip: float = 1.0
    """Bound per coordinate: values are clipped to [-clip, clip] before encoding."""
    neighbours: int = 0
    """SecAgg+ (Bell et al. 2020): each client masks with and shares its keys among only
    this many neighbours of a random regular graph (cost O(k) instead of O(n) per client);
    0 = every client (classic SecAgg)."""

    def __post_init__(self) -> None:
        if self.threshold > 1:
            if self.threshold != int(self.threshold):
                raise ConfigError(f"secagg.threshold > 1 is a client count and must be an integer, "
                                  f"got {self.threshold}")
        else:
            fraction("secagg.threshold", self.threshold, open_low=True)
        from commgnn.federated.secagg.ring import MAX_BITS  # here: secagg's package imports this module

        if not 2 <= self.ring_bits <= MAX_BITS:
            raise ConfigError(f"secagg.ring_bits must lie in [2, {MAX_BITS}], got {self.ring_bits}")
        positive("secagg.frac_bits", self.frac_bits, allow_zero=True)
        if self.frac_bits >= self.ring_bits - 1:
            raise ConfigError(f"secagg.frac_bits ({self.frac_bits}) must be below secagg.ring_bits - 1 "
                              f"({self.ring_bits - 1})")
        positive("secagg.clip", self.clip)
        positive("secagg.neighbours", self.neighbours, allow_zero=True)
        if self.neighbours == 1:
            raise ConfigError("secagg.neighbours must be 0 (all clients) or >= 2")
        top = self.clip * 2.0**self.frac_bits + 1
        if top >= 2.0**53:
            raise ConfigError(f"secagg.clip * 2^frac_bits = {top - 1:.3g} exceeds float64 precision (2^53); "
                              f"lower clip or frac_bits")
        if top >= 2.0 ** (self.ring_bits - 1):
            raise ConfigError(
                f"secagg.ring_bits = {self.ring_bits} cannot hold even one client: clip * 2^frac_bits + 1 = {top:.6g} "
                f">= 2^{self.ring_bits - 1}; raise ring_bits or lower clip / frac_bits")

    def group_size(self, n_clients: int) -> int:
        """Clients a threshold applies to: all ``n`` or, with SecAgg+, a neighbourhood."""
        if self.neighbours and self.neighbours < n_clients - 1:
            return self.neighbours + 1
        return n_clients

    def threshold_count(self, n_clients: int) -> int:
        """The Shamir threshold t for ``n_clients`` (see :attr:`threshold`)."""
        group = self.group_size(n_clients)
        if self.threshold > 1:
            t = int(self.threshold)
        else:
            t = max(1, math.ceil(self.threshold * group - 1e-9))
        what = "neighbourhood" if group < n_clients else "clients"
        if t > group:
            raise ConfigError(f"secagg.threshold = {self.threshold:g} asks for {t} shares but there are only "
                              f"{group} {what}; lower it")
        if 2 * t <= group:
            raise ConfigError(f"secagg.threshold = {self.threshold:g} gives t = {t} of {group} {what}, not above "
                              f"half: a deviating server could then unmask one client's update; raise it "
                              f"(the default is 2/3)")
        return t

    def check_clients(self, n_clients: int) -> None:
        """Raise a :class:`ConfigError` if ``n_clients`` updates cannot be summed exactly in
        the ring or the threshold does not fit them."""
        positive("number of secure-aggregation clients", n_clients)
        need = n_clients * (self.clip * 2.0**self.frac_bits + 1)
        if need >= 2.0 ** (self.ring_bits - 1):
            bits = math.floor(math.log2(need)) + 2
            raise ConfigError(
                f"secagg.ring_bits = {self.ring_bits} too small for {n_clients} clients: "
                f"n * (clip * 2^frac_bits + 1) = {need:.6g} must stay below 2^{self.ring_bits - 1}; "
                f"set ring_bits >= {bits} or lower clip / frac_bits")
        self.threshold_count(n_clients)


@dataclass(frozen=True, kw_only=True)
class NeighGenConfig:
    """``[neighgen]``: missing-neighbour generation before FedAvg (off by default)."""

    enabled: bool = False
    """Train a generator by FedAvg and mend every client's subgraph before training the
    classifier. Needs ``cross_edges = "drop"`` (mending stands in for the cut edges)."""
    hidden_fraction: float = 0.15
    """Share of a client's nodes hidden to build its impaired training graph, in (0, 1)."""
    num_pred: int = 5
    """Most neighbours generated for one node."""
    rounds: int = 20
    """FedAvg rounds that train the generator (all clients each round)."""
    local_steps: int = 10
    """Adam steps per client per generator round."""
    lr: float = 0.01
    """Adam learning rate of the clients' generator steps."""
    hidden: int = 64
    """Width ``h`` of the generator's GCN encoder."""
    latent: int = 32
    """Width ``l`` of each generated neighbour before the shared feature decoder."""
    feature_weight: float = 1.0
    """``lambda``: weight of the feature loss against the degree loss."""
    noise: float = 0.1
    """Std ``s`` of the noise added to ``z`` before feature generation."""
    batch_nodes: int = 256
    """Nodes per step in the feature loss."""

    def __post_init__(self) -> None:
        fraction("neighgen.hidden_fraction", self.hidden_fraction, open_low=True, open_high=True)
        for name in ("num_pred", "rounds", "local_steps", "hidden", "latent", "batch_nodes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"neighgen.{name} must be a positive integer, got {value!r}")
        positive("neighgen.lr", self.lr)
        positive("neighgen.feature_weight", self.feature_weight, allow_zero=True)
        positive("neighgen.noise", self.noise, allow_zero=True)




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
    checkpoint_every: int = 0
    """Write an atomic checkpoint of every rank's state every k rounds (0 = never);
    ``commgnn federate --resume RUN_DIR`` continues from the newest complete one, with the
    same rounds, metrics and accuracies as an uninterrupted run."""


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
