"""Communication configuration: ``[comm.halo]`` (the halo levers).

Example::

    [comm.halo]
    precompute = true
    transform_first = true
    bits = { forward = 4, backward = 8 }   # or bits = 8, or bits = "adaptive" with budget_mb
    sample_rate = 0.1
    staleness = { mode = "skip", threshold = 0.05, max_age = 4 }
    exact_every = 20
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Union, get_args

from commgnn.config import fraction, positive
from commgnn.errors import ConfigError

VALID_BITS = (1, 2, 4, 8, 32)


def _check_bits(name: str, bits: int) -> None:
    if bits not in VALID_BITS:
        raise ConfigError(f"{name} must be one of 1, 2, 4, 8 or 32 (32 = no quantization), got {bits}")


@dataclass(frozen=True, kw_only=True)
class BitsConfig:
    """Bits per value of halo messages; 32 sends float32 unchanged."""

    forward: int = 32
    """Bits of the embeddings sent forward (1, 2, 4, 8 or 32)."""
    backward: int = 32
    """Bits of the gradients sent backward (1, 2, 4, 8 or 32)."""

    def __post_init__(self) -> None:
        _check_bits("comm.halo.bits.forward", self.forward)
        _check_bits("comm.halo.bits.backward", self.backward)


@dataclass(frozen=True, kw_only=True)
class StalenessConfig:
    """Reuse of earlier halo rows instead of fresh ones."""

    mode: Literal["none", "pipeline", "skip"] = "none"
    """``pipeline``: compute epoch t with epoch t-1's halo rows and gradients while epoch t's
    exchange runs in the background (PipeGCN). ``skip``: resend a row only when it changed
    by more than ``threshold`` or is ``max_age`` epochs old (SANCUS)."""
    smoothing: float = 0.0
    """pipeline: EMA momentum applied to stale rows and gradients (0 = none; PipeGCN ~0.95)."""
    threshold: float = 0.05
    """skip: relative L2 change of a row, ||x - x_sent|| / ||x_sent||, above which it is resent."""
    max_age: int = 4
    """skip: a row older than this many epochs is resent whatever its change (the bound)."""
    residual_bits: int = 32
    """skip: send ``x - x_cached`` quantized to this many bits instead of ``x`` (32 = off)."""
    max_error: float = 0.0
    """pipeline: when the stale rows or gradients an epoch used were off by more than this
    (``||fresh - stale|| / ||fresh||``, measured when the fresh ones arrive, largest over
    layers and directions), the next epoch is exact; 0 = never. Logged per epoch."""

    def __post_init__(self) -> None:
        fraction("comm.halo.staleness.smoothing", self.smoothing, open_high=True)
        positive("comm.halo.staleness.threshold", self.threshold, allow_zero=True)
        positive("comm.halo.staleness.max_age", self.max_age)
        _check_bits("comm.halo.staleness.residual_bits", self.residual_bits)
        positive("comm.halo.staleness.max_error", self.max_error, allow_zero=True)


@dataclass(frozen=True, kw_only=True)
class HaloConfig:
    """Halo-exchange levers; the defaults are the exact exchange."""

    precompute: bool = False
    """Aggregate the raw input features once before training (GCN, SAGE) or keep their halo
    rows (GAT): no per-epoch exchange of input features. Input dropout then acts on the
    aggregated features (see ``precompute_dropout``)."""
    precompute_dropout: Literal["aggregate", "matched"] = "aggregate"
    """precompute, GCN and SAGE: how input dropout acts on the aggregate ``A X``.
    ``aggregate`` drops its entries (per-entry variance ``(A X)^2 p/(1-p)``, up to
    degree-times the exact model's); ``matched`` adds noise with the exact model's mean and
    per-entry variance ``p/(1-p) sum_j a_ij^2 x_jf^2`` (one more aggregation at set-up and a
    second ``[n_own, d_in]`` matrix kept). The default is the lever as first measured."""
    sparse_setup: bool = True
    """Send the one-time exchange of constant input rows (``precompute``, the first layer's
    sparse-input pattern, VR-GCN's input aggregate) as non-zero counts, column indices and
    values, the values left out when all are 1.0 (bag-of-words features); a peer's block stays
    dense where that is smaller. Lossless. ``false`` sends the dense fp32 rows."""
    transform_first: bool = False
    """Apply a layer's linear map before the exchange where that narrows the message
    (send min(d_in, d_out) columns). Exact for GCN, SAGE-mean and GAT."""
    bits: Union[int, BitsConfig, Literal["adaptive"]] = 32
    """Quantization: one width for both directions, a ``{forward, backward}`` table, or
    ``"adaptive"`` (per layer and peer, from message variance and ``budget_mb``)."""
    budget_mb: float | None = None
    """adaptive: halo megabytes (1e6) each rank may send per epoch."""
    budget_s: float | None = None
    """adaptive: seconds each rank may spend in training halo exchanges per epoch (a time
    budget, instead of ``budget_mb``): at each re-solve the byte budget becomes this times
    the rate the rank's exchanges achieved since the last one (stalls on slow peers
    included), so the widths follow the network actually seen."""
    adapt_every: int = 10
    """adaptive: re-solve the bit-widths every this many epochs."""
    sample_rate: float = 1.0
    """Fraction p of boundary rows each rank sends per epoch, scaled by 1/p (BNS-GCN)."""
    staleness: StalenessConfig = field(default_factory=StalenessConfig)
    """Reuse of stale rows (``[comm.halo.staleness]`` or an inline table)."""
    exact_every: int = 0
    """Guard: every this many epochs (counting from the first) all levers step aside and
    the exchange is exact, refreshing caches; 0 = never."""

    def __post_init__(self) -> None:
        # Plain tables are accepted from Python as from TOML.
        if isinstance(self.bits, dict):
            object.__setattr__(self, "bits", BitsConfig(**self.bits))
        if isinstance(self.staleness, dict):
            object.__setattr__(self, "staleness", StalenessConfig(**self.staleness))
        if isinstance(self.bits, int) and not isinstance(self.bits, bool):
            _check_bits("comm.halo.bits", self.bits)
            object.__setattr__(self, "bits", BitsConfig(forward=self.bits, backward=self.bits))
        if self.bits == "adaptive":
            if (self.budget_mb is None) == (self.budget_s is None):
                raise ConfigError("comm.halo.bits = 'adaptive' needs one budget: comm.halo.budget_mb (MB per rank "
                                  "per epoch) or comm.halo.budget_s (halo seconds per rank per epoch)")
            if self.budget_mb is not None:
                positive("comm.halo.budget_mb", self.budget_mb)
            else:
                positive("comm.halo.budget_s", self.budget_s)
        elif self.budget_mb is not None or self.budget_s is not None:
            raise ConfigError("comm.halo.budget_mb and budget_s are only used with bits = 'adaptive'")
        if self.precompute_dropout not in ("aggregate", "matched"):
            raise ConfigError(f"comm.halo.precompute_dropout must be 'aggregate' or 'matched', "
                              f"got {self.precompute_dropout!r}")
        if self.precompute_dropout != "aggregate" and not self.precompute:
            raise ConfigError("comm.halo.precompute_dropout shapes precompute's dropout: set "
                              "comm.halo.precompute = true, or drop precompute_dropout")
        positive("comm.halo.adapt_every", self.adapt_every)
        fraction("comm.halo.sample_rate", self.sample_rate, open_low=True)
        positive("comm.halo.exact_every", self.exact_every, allow_zero=True)
        if self.staleness.mode != "none" and self.sample_rate < 1:
            raise ConfigError(f"comm.halo: staleness.mode = '{self.staleness.mode}' and sample_rate < 1 cannot "
                              f"be combined (a reused row would belong to another epoch's sample)")

    @property
    def is_exact(self) -> bool:
        """True when no lossy lever is on (precompute / transform_first are lossless)."""
        return (self.bits == BitsConfig() and self.sample_rate == 1.0 and self.staleness.mode == "none")


GRAD_STRATEGIES = ("allreduce", "fp16", "bf16", "powersgd", "localsgd", "topk", "qsgd", "signsgd")


@dataclass(frozen=True, kw_only=True)
class GradConfig:
    """``[comm.grad]``: how gradients are combined across ranks."""

    strategy: Literal["allreduce", "fp16", "bf16", "powersgd", "localsgd", "topk", "cltk", "qsgd",
                      "signsgd"] = "allreduce"
    """``allreduce`` (fp32, exact); torch's DDP hooks ``fp16``, ``bf16``, ``powersgd``,
    ``localsgd``; written here: ``topk`` (DGC), ``cltk`` (top-k on a shared index set, so
    values are all-reduced), ``qsgd``, ``signsgd`` (with error feedback)."""
    ratio: float = 0.01
    """topk, cltk: fraction of gradient entries sent per step."""
    warmup_steps: int = 0
    """topk: steps over which the density falls from ``warmup_density`` to ``ratio``."""
    warmup_density: float = 0.25
    """topk: density at the first step of the warm-up."""
    momentum: float = 0.0
    """topk, cltk: DGC momentum correction (0 = plain error feedback): the compressor
    accumulates velocity ``u <- m u + g`` and sends from it, and the trainer's SGD then runs
    without momentum of its own."""
    clip_norm: float | None = None
    """topk: local gradient clipping at ``clip_norm / sqrt(P)`` (None = off)."""
    levels: int = 7
    """qsgd: quantization levels s (1..127)."""
    bucket: int = 512
    """qsgd: entries per norm bucket."""
    error_feedback: bool = False
    """qsgd: add error feedback (QSGD is unbiased without it)."""
    rank: int = 2
    """powersgd: matrix approximation rank."""
    start_iter: int = 10
    """powersgd / localsgd: plain all-reduce steps before compression / local steps (>= 2)."""
    period: int = 4
    """localsgd: average the models every this many steps."""
    half: bool = False
    """powersgd: run the hook on fp16 copies of the gradients (torch's
    ``fp16_compress_wrapper``), so the factors P and Q travel in half precision.
    cltk: all-reduce the chosen values in fp16 (scaled by the leader's largest)."""
    prescale: bool | None = None
    """fp16 and powersgd with ``half``: divide each bucket by the ranks' largest magnitude
    before the cast (one scalar all-reduce per bucket), so that small gradients do not sink
    into fp16's subnormals (:mod:`commgnn.comm.grad.prescale`). None = on where fp16 is used."""

    def __post_init__(self) -> None:
        fraction("comm.grad.ratio", self.ratio, open_low=True)
        fraction("comm.grad.warmup_density", self.warmup_density, open_low=True)
        fraction("comm.grad.momentum", self.momentum, open_high=True)
        if self.momentum and self.strategy not in ("topk", "cltk"):
            raise ConfigError(f"comm.grad.momentum (DGC's momentum correction) applies to strategy 'topk' or "
                              f"'cltk', not '{self.strategy}'; set train.momentum for the optimiser instead")
        positive("comm.grad.warmup_steps", self.warmup_steps, allow_zero=True)
        if self.clip_norm is not None:
            positive("comm.grad.clip_norm", self.clip_norm)
        if not 1 <= self.levels <= 127:
            raise ConfigError(f"comm.grad.levels must lie in [1, 127], got {self.levels}")
        positive("comm.grad.bucket", self.bucket)
        positive("comm.grad.rank", self.rank)
        if self.start_iter < 2:
            raise ConfigError(f"comm.grad.start_iter must be >= 2 (PowerSGD needs plain steps first), got {self.start_iter}")
        positive("comm.grad.period", self.period)
        if self.prescale and not self.uses_fp16:
            raise ConfigError(f"comm.grad.prescale applies where gradients travel in fp16 (strategy = 'fp16', "
                              f"or 'powersgd' with half = true), not to '{self.strategy}'")
        if self.half and self.strategy not in ("powersgd", "cltk"):
            raise ConfigError(f"comm.grad.half applies to strategy = 'powersgd' or 'cltk' only (got '{self.strategy}'); "
                              f"use strategy = 'fp16' for a plain half-precision all-reduce")


    @property
    def uses_fp16(self) -> bool:
        """Whether gradients travel in fp16."""
        return self.strategy == "fp16" or (self.strategy == "powersgd" and self.half)

    @property
    def prescale_on(self) -> bool:
        """The resolved ``prescale`` setting."""
        return self.uses_fp16 if self.prescale is None else self.prescale


GossipMethod = Literal["dpsgd", "dpsgd-atc", "pushsum", "tracking", "tracking-atc"]


@dataclass(frozen=True, kw_only=True)
class GossipConfig:
    """``[comm.gossip]``: decentralised training; replaces the gradient sync when present."""

    topology: str = "exponential"
    """``ring``, ``torus`` (2-D), ``exponential`` (one peer, changing each round), ``full``,
    or a graph file (edge list, GraphML or GML) with nodes 0..P-1."""
    method: GossipMethod = "dpsgd"
    """``dpsgd``: doubly stochastic averaging, then the local step (Lian et al.);
    ``dpsgd-atc``: the local step, then the averaging (exactly the all-reduce when the
    topology is ``full``); ``pushsum``: push-sum weights (directed or
    time-varying graphs); ``tracking``: D-PSGD plus a tracker of the average gradient
    (twice the bytes; for partitions whose losses differ); ``tracking-atc``: the same in
    adapt-then-combine form (mix after the local change)."""
    momentum: float = 0.0
    """QG-DSGDm: quasi-global heavy-ball momentum of this factor, built from each model's
    displacement (:mod:`commgnn.comm.gossip.quasi_global`); the trainer's SGD then runs without
    momentum of its own. 0 = off (each rank's optimiser keeps its local momentum)."""
    average_every: int = 0
    """Gossip-PGA: every this many rounds an exact all-reduce average of the models replaces
    the gossip round (:mod:`commgnn.comm.gossip.global_average`); 0 = never. ``dpsgd`` only."""

    def __post_init__(self) -> None:
        if self.method not in get_args(GossipMethod):  # also when built from Python, not TOML
            choices = ", ".join(repr(m) for m in get_args(GossipMethod))
            raise ConfigError(f"comm.gossip.method: {self.method!r} is not one of {choices}")
        positive("comm.gossip.average_every", self.average_every, allow_zero=True)
        fraction("comm.gossip.momentum", self.momentum, open_high=True)
        if self.average_every and self.method != "dpsgd":
            raise ConfigError(f"comm.gossip.average_every applies to method = 'dpsgd' only, not "
                              f"'{self.method}' (its exact average replaces D-PSGD's mix-then-step round)")


@dataclass(frozen=True, kw_only=True)
class CommConfig:
    """``[comm]``: communication strategies."""

    halo: HaloConfig = field(default_factory=HaloConfig)
    """``[comm.halo]``: halo-exchange levers."""
    grad: GradConfig = field(default_factory=GradConfig)
    """``[comm.grad]``: gradient synchronisation."""
    gossip: GossipConfig | None = None
    """``[comm.gossip]``: decentralised averaging instead of ``grad`` (None = off)."""
