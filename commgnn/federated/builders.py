"""Setting a federation up, one builder per concern: the data and its client split, the
clients, the model, the random generators, privacy (DP), and aggregation (codecs, robust
rules, secure-aggregation checks).

:class:`FederationSetup` runs them in that order; :class:`~commgnn.federated.engine.Federation`
adds the rounds. Each builder reads only what the builders before it set, so the order in
:meth:`FederationSetup.__init__` is the dependency order. Every check that can refuse a
run (ranks that disagree on the split, a policy that forbids the plan, a secure-aggregation
threshold or ring the cohort cannot meet) fails here, before any round.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from dataclasses import replace
from typing import Any

import torch

from commgnn.data import load_dataset
from commgnn.data.stratified_split import stratified_split
from commgnn.distributed.context import DistContext
from commgnn.errors import ConfigError
from commgnn.federated import dp as dpmod
from commgnn.federated import uplink as up
from commgnn.federated.byzantine import GaussianNoise, ScaleAttack, SignFlip
from commgnn.federated.client import Client
from commgnn.federated.client_data import build_clients
from commgnn.federated.client_split import split_from_config
from commgnn.federated.config import FederateConfig
from commgnn.federated.model import FedGCN
from commgnn.federated.policy import CountingGate, PolicyGate, load_policy
from commgnn.federated.robust import make_aggregator
from commgnn.federated.tally import Tally
from commgnn.federated.transport import Transport

COUNT_RING_BITS, COUNT_FRAC_BITS = 32, 16
"""The adaptive clip's secure count: fixed point with 2^-16 resolution in a 32-bit ring, so
the noised sum of centred bits must stay inside +-2^15 (checked at start-up)."""


def _masks(graph: Any, cfg: FederateConfig) -> None:
    """60/20/20 stratified masks (FederatedScope-GNN's protocol) unless the dataset's own are asked for."""
    if cfg.federated.masks == "stratified":
        tr, va, te = stratified_split(graph.y, cfg.data.train_ratio, cfg.data.val_ratio, cfg.data.split_seed)
        graph.train_mask, graph.val_mask, graph.test_mask = tr, va, te


class FederationSetup:
    """A federation's parts, built in dependency order (see the module docstring)."""

    def __init__(self, cfg: FederateConfig, graph: Any = None, *, ctx: DistContext | None = None) -> None:
        self.cfg = cfg
        self._build_data(graph, ctx)
        self._build_policy()
        self._build_clients()
        self._build_model()
        self._build_generators()
        self.tally = Tally()
        self.neighgen_report: dict[str, Any] | None = None
        self._build_privacy()
        self._build_aggregation()

    def _build_data(self, graph: Any, ctx: DistContext | None) -> None:
        """The graph, its masks, the client split and the transport; every rank checks that
        it computed the same split, masks and settings as rank 0."""
        cfg, fed = self.cfg, self.cfg.federated
        self.graph = graph if graph is not None else load_dataset(cfg.data)
        _masks(self.graph, cfg)
        g = self.graph
        self.num_classes = int(g.y.max()) + 1
        self.owner = split_from_config(g, cfg.split)
        self.n_clients = int(self.owner.max()) + 1
        self.degree = torch.bincount(g.edge_index[1], minlength=g.num_nodes)
        self.t = Transport(ctx, 1 if fed.algorithm == "central" else self.n_clients)
        if self.t.world > 1 and (fed.algorithm in ("local", "central") or fed.cross_edges == "embeddings"
                                 or cfg.neighgen.enabled):
            what = ("cross_edges = embeddings" if fed.cross_edges == "embeddings" else "neighgen"
                    if cfg.neighgen.enabled else fed.algorithm)
            raise ConfigError(f"{what} runs in one process for now: use --parts 1")
        # Every rank loads, masks and splits the graph itself: a disagreement would put the
        # clients' predictions on other nodes than the server scores, so it is checked.
        placement = hashlib.sha1()
        for t in (self.owner, g.train_mask, g.val_mask, g.test_mask, g.y):
            placement.update(t.detach().cpu().contiguous().numpy().tobytes())
        self.split_digest = placement.hexdigest()
        """Digest of the split, masks and labels: a checkpoint is of this federation only if it records it."""
        placement.update(repr(cfg).encode())  # and the same settings: collectives follow from them
        self.t.agree(placement.hexdigest(), "client split, masks or config")

    def _build_policy(self) -> None:
        """The governance policy (checked against the clients and the plan) and its gate."""
        cfg, fed = self.cfg, self.cfg.federated
        self.policy = load_policy(cfg.policy.path) if cfg.policy.path else None
        if self.policy is not None:
            self.policy.validate_for(self.n_clients)
            self.policy.check_plan(secure_agg=cfg.secagg.enabled, embeddings_cross=fed.cross_edges == "embeddings",
                                   embedding_bits=fed.embedding_bits, embedding_noise=fed.embedding_noise)
        self.gate: PolicyGate | CountingGate = PolicyGate(self.policy) if self.policy else CountingGate()

    def _build_clients(self) -> None:
        """The clients this rank hosts, and what the server knows of every client (its
        training-node count: FedAvg's weight)."""
        fed, g = self.cfg.federated, self.graph
        parts = build_clients(g, torch.zeros_like(self.owner) if fed.algorithm == "central" else self.owner)
        glob = self.degree if fed.cross_edges == "embeddings" else None
        hosted = set(self.t.hosted())  # a rank builds only the clients it hosts
        self.clients: dict[int, Client] = {c: Client(p, fed, global_degree=glob) for c, p in enumerate(parts)
                                           if c in hosted}
        self.num_train = torch.tensor([int(p.train_mask.sum()) for p in parts])

    def _build_model(self) -> None:
        """The global GCN, initialised from ``federated.seed`` (the same on every rank)."""
        fed, g = self.cfg.federated, self.graph
        torch.manual_seed(fed.seed)
        self.model = FedGCN(g.x.shape[1], fed.hidden, self.num_classes, fed.dropout)
        self.dim = sum(p.numel() for p in self.model.parameters())
        self.shapes = [tuple(p.shape) for p in self.model.parameters()]

    def _build_generators(self) -> None:
        """Every random draw's own generator, so that a run gives the same result whatever
        the number of ranks (and a checkpoint can hold each one's state)."""
        fed = self.cfg.federated
        self.gen = torch.Generator().manual_seed(fed.seed + 1)  # participation draws (every rank alike)
        self.noise_gen = torch.Generator().manual_seed(fed.seed + 2)  # the server's DP noise (server only)
        self.cgen = {c: torch.Generator().manual_seed(fed.seed * 1_000_003 + 7919 * (c + 1)) for c in self.clients}
        self.eval_gen = {c: torch.Generator() for c in self.clients}  # evaluation never moves training's draws
        # Protective noise (DP noise, the cross-client embeddings' noise): from secret seeds that
        # only the party drawing it knows, unless the config asks for reproducible (seeded, not
        # private) noise; then the draws are training's (and evaluation's) generators'.
        if self.cfg.dp.reproducible_noise:
            self.dp_gen, self.dp_eval_gen, self.dp_server_gen = dict(self.cgen), self.eval_gen, self.noise_gen
        else:
            self.dp_gen = {c: torch.Generator().manual_seed(secrets.randbits(63)) for c in self.clients}
            self.dp_eval_gen = self.dp_gen
            self.dp_server_gen = torch.Generator().manual_seed(secrets.randbits(63))

    def _build_privacy(self) -> None:
        """The cohort, the DP noise multiplier (split with the adaptive clip's count) and
        the accountant, charged at the real sample rate K / n."""
        cfg, fed = self.cfg, self.cfg.federated
        self.cohort = max(1, round(fed.participation * self.t.n_clients))
        self.sample_rate = self.cohort / self.t.n_clients
        self.sigma = 0.0  # the noise multiplier of the updates
        self.accountant: dpmod.ClientDPAccountant | None = None
        self.adaptive: dpmod.AdaptiveClip | None = None
        if cfg.dp.enabled:
            total = cfg.dp.noise_multiplier or dpmod.calibrate(cfg.dp, fed.rounds, self.sample_rate)
            self.sigma = total
            if cfg.dp.adaptive_clip:  # the clipped-count release takes its share of the noise
                self.adaptive = dpmod.AdaptiveClip(cfg.dp, n_participants=self.cohort)
                self.sigma = self.adaptive.update_noise_multiplier(total)
            self.accountant = dpmod.ClientDPAccountant(delta=cfg.dp.delta, clip=cfg.dp.clip, noise_multiplier=total)

    def _build_aggregation(self) -> None:
        """The clients' codecs and the server's decoder, the robust rule, the Byzantine
        harness, and the checks that the cohort fits secure aggregation's threshold and rings."""
        cfg, fed = self.cfg, self.cfg.federated
        self.codecs = {c: self._codec(c) for c in self.clients}
        self.decoder = self._codec(0)  # the server's copy: decodes sums, never encodes
        self.aggregator = (make_aggregator(fed.aggregator, **self._agg_kw()) if fed.aggregator != "mean" else None)
        self.attack = {"scale": ScaleAttack(-10.0), "flip": SignFlip(), "noise": GaussianNoise(1.0)}[fed.attack]
        if self.aggregator is not None:
            self.aggregator.validate(self.cohort)
        if cfg.secagg.enabled and fed.algorithm in ("fedavg", "fedprox"):
            if self.cohort < 2:  # a "sum" of one update is that update
                raise ConfigError(f"secure aggregation needs at least 2 clients per round, got {self.cohort}; "
                                  f"raise --participation or --clients")
            cfg.secagg.threshold_count(self.cohort)  # a threshold or ring the cohort cannot meet fails now
            self.decoder.ring_bits(self.cohort)
            if cfg.neighgen.enabled:  # the generator's rounds sum every client, not a cohort
                cfg.secagg.threshold_count(self.n_clients)
                cfg.secagg.check_clients(self.n_clients)
            limit = 2 ** (COUNT_RING_BITS - COUNT_FRAC_BITS - 1)  # the noised count, |sum| <= K/2, must not wrap
            if self.adaptive is not None and (bound := self.cohort / 2 + 8 * self.adaptive.count_stddev) >= limit:
                raise ConfigError(f"the adaptive clip's secure count would overflow its ring: {self.cohort} participants "
                                  f"and count_stddev {self.adaptive.count_stddev:g} reach {bound:.0f} (limit {limit}); "
                                  f"lower --participation or dp.count_stddev")

    def _dp_clip(self) -> float | None:
        """Under DP, the per-coordinate range of a codec: the clip bound plus six standard
        deviations of a client's noise share, so clamping never truncates the noise the
        accountant counts on (None without DP)."""
        if not self.cfg.dp.enabled:
            return None
        clip = self.cfg.dp.clip_ceiling  # an adaptive clip never goes above it
        share = self.sigma * clip / math.sqrt(self.cohort) if self.cfg.dp.noise_at == "clients" else 0.0
        return clip + 6.0 * share

    def _agg_kw(self) -> dict[str, Any]:
        fed = self.cfg.federated
        return {"trimmed_mean": {"beta": fed.trim}, "krum": {"f": fed.krum_f}}.get(fed.aggregator, {})

    # ---------------------------------------------------------------- codecs
    def _codec(self, client: int) -> up.UplinkCodec:
        u, seed = self.cfg.uplink, self.cfg.federated.seed
        clip = self._dp_clip() or u.clip or 1.0
        if u.codec == "fp32":
            if self.cfg.secagg.enabled:
                sa = self.cfg.secagg
                if self._dp_clip() is not None and self._dp_clip() > sa.clip:  # widen the fixed-point range
                    sa = replace(sa, clip=math.ceil(self._dp_clip()))
                    sa.check_clients(self.cohort)
                return up.FixedPoint(sa, dim=self.dim, seed=seed, client=client)
            return up.Plain(dim=self.dim)
        if u.codec == "quant":
            return up.SharedScaleQuant(u.bits, clip, dim=self.dim, seed=seed, client=client)
        if u.codec == "randomk":
            return up.RandomK(u.fraction, dim=self.dim, seed=seed, bits=u.bits, clip=clip, client=client,
                              error_feedback=u.error_feedback, residual_decay=u.residual_decay)
        return up.RankR(u.rank, shapes=self.shapes, seed=seed, bits=u.bits, clip=clip, client=client,
                        error_feedback=u.error_feedback, residual_decay=u.residual_decay)

