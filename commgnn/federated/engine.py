"""The federated round loop: clients train, updates are clipped, noised, compressed,
securely summed and applied; every payload passes the governance gate and is counted.

One round r (FedAvg / FedProx), with K participants drawn from the n clients:

    w_r                     the global parameters, broadcast to the K participants   [d]
    u_c = train_c(w_r) - w_r                                                         [d]
    u_c <- clip(u_c, C) + N(0, (sigma C)^2 / K)            (DP, noise at the clients)
    v_c = a_c u_c           a_c = K n_c / sum n  (samples) or 1 (uniform, forced by DP)
    S   = sum_c decode(encode(v_c))      under secure aggregation: the server sees only S
    w_{r+1} = w_r + server_lr S / K

A robust aggregator (median, trimmed mean, Krum) replaces the sum by a rule over the
individual ``v_c`` (so it cannot run under secure aggregation). ``local`` trains each
client alone; ``central`` trains one model on the whole graph with the same steps.

Placement (:mod:`.transport`): in one process the server and every client live
together; with W > 1 ranks, rank 0 is the server and the clients are spread over ranks
1..W-1. Every random draw of client ``c`` comes from its own generator, so a run gives
the same result whatever W is. The bytes counted are those each message carries between
organisations (the server counts them), whatever the placement.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Mapping

import torch
from torch import Tensor

from commgnn.errors import ConfigError
from commgnn.federated import dp as dpmod
from commgnn.federated import neighgen
from commgnn.federated import uplink as up
from commgnn.federated.builders import COUNT_FRAC_BITS, COUNT_RING_BITS, FederationSetup
from commgnn.federated.client import Client
from commgnn.federated.client_data import split_stats
from commgnn.federated.fairness import fairness_report
from commgnn.federated.model import flat_params
from commgnn.federated.policy import Payload, PolicyGate, reserve_everywhere
from commgnn.federated.secagg import ring
from commgnn.federated.secure_sum import secure_sum
from commgnn.federated.state import federation_state, load_federation_state


class Federation(FederationSetup):
    """Server plus clients in one process (or this rank's share of them); built by
    :class:`~commgnn.federated.builders.FederationSetup`, :meth:`run` trains and returns the
    summary."""

    def _set_clip(self, clip: float) -> None:
        """Re-scale every quantising codec (keeping error-feedback residuals); under DP the
        range stays fixed (:meth:`_dp_clip`)."""
        if self.cfg.uplink.codec == "fp32" or self.cfg.uplink.clip or self.cfg.dp.enabled:
            return
        for codec in [*self.codecs.values(), self.decoder]:
            quantiser = getattr(codec, "quant", codec)
            quantiser.clip, quantiser.scale = clip, clip / quantiser.levels

    # ---------------------------------------------------------------- cross-client embeddings
    def _cross_terms(self, params: Tensor, active: list[int] | None, *,
                     evaluating: bool = False) -> dict[int, tuple[Tensor, Tensor] | None]:
        """Each client's constant terms ``(C1, C2)`` from its neighbours in other clients
        (``cross_edges = "embeddings"``; None when dropped). Two exchanges: first every
        owner's layer-1 rows, then, with each owner's ``C1`` in hand, its layer-2 rows;
        every row passes the gate and is counted (evaluation's rows apart from training's)."""
        fed = self.cfg.federated
        targets = active if active is not None else sorted(self.clients)
        if fed.cross_edges != "embeddings":
            return {c: None for c in targets}
        from commgnn.federated.model import load_flat
        load_flat(self.model, params)
        gens = self.dp_eval_gen if evaluating else self.dp_gen
        need = {c: self.clients[c].needs_from() for c in self.clients}

        def exchange(c: int, layer: int, cross1: dict[int, Tensor]) -> Tensor:
            width = fed.hidden if layer == 1 else self.num_classes
            incoming = {}
            for src, ids in need[c].items():
                rows = self.clients[src].layer_rows(self.model, ids, layer, cross1.get(src))
                rows, nbytes = Client.protect(rows, bits=fed.embedding_bits, noise=fed.embedding_noise, gen=gens[src])
                self.gate.admit(Payload(kind="embeddings", src_client=src, dst=c, nbytes=nbytes,
                                        bits=fed.embedding_bits, noise_std=fed.embedding_noise))
                if evaluating:
                    self.tally.evaluation += nbytes
                else:
                    self.tally.embeddings += nbytes
                    self.tally.client(src, nbytes)
                incoming[src] = (ids, rows)
            return self.clients[c].cross_term(incoming, width)

        # Layer 2's rows need their owner's C1: every client whose rows a target needs.
        owners = sorted({src for c in targets for src in need[c]} | set(targets))
        self.owners = owners  # they compute rows with this round's model: each must hold it
        c1 = {c: exchange(c, 1, {}) for c in owners}
        out: dict[int, tuple[Tensor, Tensor] | None] = {}
        for c in targets:
            out[c] = (c1[c], exchange(c, 2, c1))
        return out

    # ---------------------------------------------------------------- one round
    def _participants(self) -> list[int]:
        n = self.t.n_clients
        k = max(1, round(self.cfg.federated.participation * n))
        return sorted(torch.randperm(n, generator=self.gen)[:k].tolist())

    def _round(self, r: int, params: Tensor) -> Tensor:
        """One round; every rank returns the new global parameters (the server's broadcast)."""
        cfg, fed = self.cfg, self.cfg.federated
        active = self._participants()  # the server's draw; every rank draws the same
        before = self._reserve(f"round {r + 1}", lambda g: g.round_costs(active, self._payload_size(len(active))))
        mine = [c for c in active if c in self.clients]
        if self.t.is_server:
            self.tally.downlink += len(active) * self.dim * 4  # the global model to each participant
        cross = self._cross_terms(params, mine)
        if self.t.is_server and fed.cross_edges == "embeddings":  # owners outside the cohort need the model too
            self.tally.downlink += len(set(self.owners) - set(active)) * self.dim * 4
        t0 = time.perf_counter()
        updates = {c: self.clients[c].train(self.model, params, cross=cross[c], gen=self.cgen[c])[0] for c in mine}
        self.tally.train_s += time.perf_counter() - t0
        K = len(active)
        clip = self.adaptive.clip if self.adaptive is not None else cfg.dp.clip
        norms: dict[int, float] = {}
        if cfg.dp.enabled:  # clip, then each client adds its share of the noise
            for c in mine:
                updates[c], norms[c] = dpmod.privatise_update(updates[c], clip=clip, sigma=self.sigma,
                                                              n_participants=K, at=cfg.dp.noise_at,
                                                              generator=self.dp_gen[c])
        for c in mine:
            if c < fed.byzantine:  # the harness: this client forges its update
                updates[c] = self.attack(updates[c][None], updates[c][None], self.cgen[c])[0]
        weights = self._weights(active)
        scaled = {c: updates[c] * weights[c] for c in mine}
        total = self._combine(r, active, scaled)
        count = self._clipped_count(r, active, norms) if self.adaptive is not None else None
        new: tuple[Tensor, float, float | None] | None = None
        if self.t.is_server:
            assert total is not None
            if cfg.dp.enabled and cfg.dp.noise_at == "server":
                total = total + dpmod.noise_for((self.dim,), self.sigma, clip, K, self.dp_server_gen, "server")
            if self.accountant is not None:
                self.accountant.step(sample_rate=self.sample_rate, clip=clip)
            mean = total / K
            next_clip = None
            if self.adaptive is not None:
                assert count is not None
                next_clip = self.adaptive.update(*count)
            # The next round's shared quantiser scale, from what every party sees (the aggregate).
            new = (params + fed.server_lr * mean, max(1e-3, 4.0 * float(mean.abs().max())), next_clip)
        params, scale, next_clip = self.t.broadcast(new)
        if self.adaptive is not None:  # every rank's clients clip the next round with the server's C
            self.adaptive.clip = next_clip
        if not cfg.uplink.clip:
            self._set_clip(scale)
        if before is not None:
            assert isinstance(self.gate, PolicyGate)
            self.gate.learn_round(before)
        return params

    def _clipped_count(self, r: int, active: list[int], norms: dict[int, float]) -> tuple[float, int] | None:
        """Adaptive clipping's release, on the server: ``(sum_c 1[||u_c|| <= C] + N(0, sigma_b^2),
        n summed)`` (None on other ranks).

        Each client releases its centred bit ``b_c - 1/2`` (sensitivity 1/2, the noise split
        of :class:`~commgnn.federated.dp.AdaptiveClip`) with its noise share
        (``noise_at = "clients"``). Under secure aggregation the bits travel through their own
        secure sum (fixed point, 16 fraction bits in a 32-bit ring), so the server learns only
        the noised sum; otherwise they go in the clear (4 bytes each) and the server adds the
        noise. The server adds back n/2, and tops the noise up for clients whose share is
        missing from the sum (dropped out), so the count always carries N(0, sigma_b^2).
        """
        cfg, ad = self.cfg, self.adaptive
        assert ad is not None
        K, at = len(active), cfg.dp.noise_at
        sent = {c: ad.centred_bit(n) + (ad.count_noise(K, self.dp_gen[c], "clients") if at == "clients" else 0.0)
                for c, n in norms.items()}
        secure = cfg.secagg.enabled
        if isinstance(self.gate, PolicyGate):
            for c in sent:
                self.gate.check(Payload(kind="update", src_client=c, dst="server", nbytes=4, secure=secure))
        per_client: dict[int, int] = {}
        if secure:
            m, frac = COUNT_RING_BITS, COUNT_FRAC_BITS
            codes = {c: ring.encode(torch.tensor([b], dtype=torch.float64), m=m, frac_bits=frac, generator=self.cgen[c])
                     for c, b in sent.items()}
            s, stats = secure_sum(self.t, codes, dim=1, cohort=active, m=m, threshold=cfg.secagg.threshold_count(K),
                                  round_id=r, neighbours=cfg.secagg.neighbours or None,
                                  graph_seed=cfg.federated.seed + r)
            if s is None:
                return None
            self.tally.secagg_s += stats.seconds
            for c in active:
                per_client[c] = sum(stats.up.get(c, {}).values())
                self.tally.downlink += sum(stats.down.get(c, {}).values())
            summed = len(stats.survivors)
            total = float(ring.decode(s, m=m, frac_bits=frac, dtype=torch.float64)[0])
        else:
            got = self.t.gather_dicts(sent)
            if got is None:
                return None
            per_client = {c: 4 for c in got}
            summed = len(got)
            total = float(sum(got.values()))
        for c, nbytes in per_client.items():
            self._uplink(c, nbytes, 4, secure=secure, codec_bits=False)
        total += summed / 2
        if at == "server":
            total += ad.count_noise(K, self.dp_server_gen, "server")
        elif summed < K:  # the dropped clients' noise shares: N(0, sigma_b^2 (K - summed) / K)
            total += ad.count_noise(K, self.dp_server_gen, "server") * math.sqrt((K - summed) / K)
        return total, summed

    def _weights(self, active: list[int]) -> dict[int, float]:
        """``a_c``: ``K n_c / sum n`` (FedAvg) or 1 (uniform; forced by DP, whose sensitivity
        is one clipped update, and by robust rules, whose bounds assume unweighted inputs and
        which must not let a client raise its say by claiming more samples)."""
        if self.cfg.federated.weighting == "uniform" or self.cfg.dp.enabled or self.aggregator is not None:
            return {c: 1.0 for c in active}
        counts = self.num_train[active].float()
        w = counts * len(active) / counts.sum().clamp(min=1)
        return {c: float(w[i]) for i, c in enumerate(active)}

    def _payload_size(self, K: int) -> int:
        """Bytes of one client's update payload in a cohort of ``K`` (masked, plain or coded),
        without SecAgg's key and share messages."""
        cfg = self.cfg
        if cfg.secagg.enabled and self.aggregator is None:
            return self.decoder.payload_bytes(K)
        return self.dim * 4 if cfg.uplink.codec == "fp32" else math.ceil(self.decoder.out_dim * cfg.uplink.bits / 8)

    def _reserve(self, what: str, costs: Callable[[PolicyGate], dict[int, int]]) -> dict[int, int] | None:
        """:func:`~commgnn.federated.policy.reserve_everywhere` with this run's gate and transport."""
        return reserve_everywhere(self.gate, self.t, what, costs)

    def _combine(self, r: int, active: list[int], scaled: dict[int, Tensor]) -> Tensor | None:
        """The server's ``S`` (None on other ranks): robust rule, secure sum or plain sum."""
        cfg, t = self.cfg, self.t
        K = len(active)
        if isinstance(self.gate, PolicyGate):  # each client asks the policy before its update leaves
            secure = cfg.secagg.enabled and self.aggregator is None
            bits = None if cfg.uplink.codec == "fp32" else cfg.uplink.bits
            size = self._payload_size(K)
            for c in scaled:
                self.gate.check(Payload(kind="update", src_client=c, dst="server", nbytes=size, bits=bits,
                                        secure=secure))
        if self.aggregator is not None:  # robust: the server sees each update (fp32, unmasked)
            got = t.gather_dicts(scaled)
            if got is None:
                return None
            for c in got:
                self._uplink(c, self.dim * 4, self.dim * 4, secure=False)
            return self.aggregator.aggregate(torch.stack(list(got.values()))) * K
        codes = {c: self.codecs[c].encode(scaled[c], r) for c in scaled}
        if cfg.secagg.enabled:
            return self._secure_total(r, active, codes, self.decoder)
        got = t.gather_dicts(codes)  # no masking: codes summed as plain integers, each at its own width
        if got is None:
            return None
        per_client = self.dim * 4 if cfg.uplink.codec == "fp32" else math.ceil(self.decoder.out_dim * cfg.uplink.bits / 8)
        for c in got:
            self._uplink(c, per_client, per_client, secure=False)
        return self.decoder.decode_sum(torch.stack(list(got.values())).sum(0), K, r)

    def _secure_total(self, r: int, active: list[int], codes: dict[int, Tensor], decoder: up.UplinkCodec, *,
                      codec_bits: bool = True) -> Tensor | None:
        """The decoded secure sum of this rank's clients' ``codes`` (None off the server),
        its masked payloads and SecAgg messages counted per client."""
        sa, K = self.cfg.secagg, len(active)
        total, stats = secure_sum(self.t, codes, dim=decoder.out_dim, cohort=active, m=decoder.ring_bits(K),
                                  threshold=sa.threshold_count(K), round_id=r, neighbours=sa.neighbours or None,
                                  graph_seed=self.cfg.federated.seed + r)
        if total is None:
            return None
        self.tally.secagg_s += stats.seconds
        if self.cfg.dp.enabled and len(stats.survivors) < K:
            # Each client carries 1/K of the noise variance: a sum without some of them is noised
            # below what the accountant was charged. Fail closed (no top-up is implemented for
            # the update; today's transport never drops a client).
            raise ConfigError(f"round {r}: {K - len(stats.survivors)} client(s) dropped out of the secure "
                              f"sum under DP, so the update would carry less noise than accounted; stopping")
        for c in active:
            self._uplink(c, sum(stats.up.get(c, {}).values()), decoder.payload_bytes(K), secure=True,
                         codec_bits=codec_bits)
            self.tally.downlink += sum(stats.down.get(c, {}).values())
        return decoder.decode_sum(total, K, r)

    def _uplink(self, c: int, nbytes: int, payload: int, *, secure: bool, codec_bits: bool = True) -> None:
        """Admit and count one client's upload; ``codec_bits=False``: its values are 32-bit,
        not the uplink codec's (the adaptive clip's count)."""
        u = self.cfg.uplink
        bits = None if u.codec == "fp32" or not codec_bits else u.bits
        self.gate.admit(Payload(kind="update", src_client=c, dst="server", nbytes=nbytes, bits=bits,
                                noise_std=0.0, secure=secure))
        self.tally.uplink += nbytes
        self.tally.payload_uplink += payload
        self.tally.client(c, nbytes)

    # ---------------------------------------------------------------- neighgen
    def _mend(self) -> None:
        """Train the missing-neighbour generator by FedAvg (its bytes counted like updates),
        then rebuild every client on its mended subgraph (:mod:`commgnn.federated.neighgen`)."""
        ng, fed = self.cfg.neighgen, self.cfg.federated
        datas = {c: client.data for c, client in self.clients.items()}
        model, params, rep = neighgen.train_generator(datas, int(self.graph.x.shape[1]), ng, seed=fed.seed + 3,
                                                      gens=self.cgen, summed=self._generator_sum)
        made = 0
        for c, client in list(self.clients.items()):
            extra = neighgen.mend(model, params, client.data, client.x_op, client.adj, ng.num_pred)
            self.clients[c] = Client(client.data, fed, global_degree=None, generated=extra)
            made += extra.num_nodes
        self.neighgen_report = {**rep, "rounds": ng.rounds, "generator_params": int(params.numel()),
                                "generated_nodes": made, "cut_links": sum(d.num_cross for d in datas.values()),
                                "uplink_bytes": self.tally.uplink, "downlink_bytes": self.tally.downlink}

    def _generator_sum(self, r: int, updates: Mapping[int, Tensor]) -> Tensor:
        """One generator round's sum over the clients: secure (the ``[secagg]`` fixed point)
        when secure aggregation is on, on its own round ids so no mask is ever reused."""
        active, dim, sa = sorted(updates), int(next(iter(updates.values())).numel()), self.cfg.secagg
        K, rid = len(active), 1_000_000 + r
        self.tally.downlink += K * dim * 4  # the generator to each client
        if not sa.enabled:
            for c in active:
                self._uplink(c, dim * 4, dim * 4, secure=False, codec_bits=False)
            return torch.stack([updates[c] for c in active]).sum(0)
        codecs = {c: up.FixedPoint(sa, dim=dim, seed=self.cfg.federated.seed + 3, client=c) for c in active}
        if isinstance(self.gate, PolicyGate):  # each client asks the policy before its update leaves
            for c in active:
                self.gate.check(Payload(kind="update", src_client=c, dst="server", nbytes=codecs[c].payload_bytes(K),
                                        secure=True))
        total = self._secure_total(rid, active, {c: codecs[c].encode(updates[c], rid) for c in active},
                                   codecs[active[0]], codec_bits=False)
        assert total is not None  # one process (checked at start-up)
        return total

    # ---------------------------------------------------------------- evaluation
    def _predict(self, params: dict[int, Tensor] | Tensor) -> Tensor | None:
        """Predictions ``[N]`` of every node by its own client (its own model for ``local``),
        assembled at the server (None elsewhere)."""
        shared = params if isinstance(params, Tensor) else None
        wire = torch.uint8 if self.num_classes <= 256 else torch.int32  # the narrowest class id
        if self.cfg.federated.algorithm != "central":  # the predictions' bytes to the server, before any moves
            size = torch.bincount(self.owner, minlength=self.n_clients) * wire.itemsize
            self._reserve("evaluation", lambda g: {c: int(size[c]) for c in range(self.n_clients)})
        cross = self._cross_terms(shared, None, evaluating=True) if shared is not None else {c: None for c in self.clients}
        mine = {c: client.predict(self.model, shared if shared is not None else params[c], cross[c]).to(wire)
                for c, client in self.clients.items()}
        got = self.t.gather_dicts(mine)
        if got is None:
            return None
        pred = torch.empty(self.graph.num_nodes, dtype=torch.long)
        nodes = self._nodes()
        for c, p in got.items():
            nbytes = p.numel() * p.element_size()
            if self.cfg.federated.algorithm != "central":  # central: no client, nothing crosses
                self.gate.admit(Payload(kind="evaluation", src_client=c, dst="server", nbytes=nbytes))
                self.tally.evaluation += nbytes
            pred[nodes[c]] = p.long()
        return pred

    def _nodes(self) -> dict[int, Tensor]:
        """Global node ids of every client (central: all nodes)."""
        if self.cfg.federated.algorithm == "central":
            return {0: torch.arange(self.graph.num_nodes)}
        return {c: (self.owner == c).nonzero().view(-1) for c in range(self.n_clients)}

    def _acc(self, pred: Tensor, mask: Tensor) -> float:
        return float((pred[mask] == self.graph.y[mask]).float().mean()) if mask.any() else float("nan")

    # ---------------------------------------------------------------- the run
    def run(self, on_eval: Callable[[dict[str, Any]], None] | None = None, *,
            state: Mapping[str, Any] | None = None,
            on_checkpoint: Callable[[int, dict[str, Any]], None] | None = None,
            checkpoint_every: int = 0) -> dict[str, Any] | None:
        """Train for ``rounds``; return the summary (accuracy at the best validation round)
        on the server, None on the ranks that only host clients.

        ``state``: a checkpoint of this rank (:func:`~commgnn.federated.state.federation_state`)
        to continue from; the rounds after it are those of the uninterrupted run. Every
        ``checkpoint_every`` rounds each rank calls ``on_checkpoint(round, state)`` (on every
        rank alike). A round's state is taken after its evaluation, or before the evaluation
        that only the last round forces, so that a run stopped there and extended (more
        ``rounds``) evaluates and draws exactly as one that ran the longer schedule."""
        fed = self.cfg.federated
        params: Tensor | dict[int, Tensor] = flat_params(self.model)
        if fed.algorithm == "local":
            params = {c: params.clone() for c in self.clients}
        best: dict[str, Any] = {"val": -1.0, "round": 0, "pred": None}
        t_start = time.perf_counter()
        if self.cfg.neighgen.enabled:  # before a checkpoint is loaded: it rebuilds the clients
            self._mend()
        curve: list[dict[str, Any]] = []
        start, wall0 = 0, 0.0
        if state is not None:
            start, params, best, curve, wall0 = load_federation_state(self, state)
            if start > fed.rounds:
                raise ConfigError(f"the checkpoint is of round {start}, past federated.rounds = {fed.rounds}; "
                                  f"give --rounds {start} or more")

        def save(r: int) -> None:
            if on_checkpoint is not None:
                on_checkpoint(r, federation_state(self, round_done=r, params=params, best=best, curve=curve,
                                                  wall_s=wall0 + time.perf_counter() - t_start))

        for r in range(start, fed.rounds):
            if fed.algorithm in ("fedavg", "fedprox"):
                params = self._round(r, params)
            else:
                t0 = time.perf_counter()
                if fed.algorithm == "local":
                    for c, client in self.clients.items():
                        params[c] = params[c] + client.train(self.model, params[c], cross=None, gen=self.cgen[c])[0]
                else:
                    params = params + self.clients[0].train(self.model, params, cross=None, gen=self.cgen[0])[0]
                self.tally.train_s += time.perf_counter() - t0
            regular = not (r + 1) % fed.eval_every
            due = bool(checkpoint_every) and not (r + 1) % checkpoint_every
            if due and not regular:
                save(r + 1)
            if regular or r + 1 == fed.rounds:
                self._evaluate(r, params, curve, best, on_eval, wall0 - t_start)
            if due and regular:
                save(r + 1)
        clamped = self.t.gather(sum(up.clamped_count(c) for c in self.codecs.values()))
        if not self.t.is_server:
            return None
        assert clamped is not None
        wall = wall0 + time.perf_counter() - t_start
        return {**self._summary(best, curve, wall), "uplink_clamped_values": sum(clamped)}

    def _evaluate(self, r: int, params: Tensor | dict[int, Tensor], curve: list[dict[str, Any]],
                  best: dict[str, Any], on_eval: Callable[[dict[str, Any]], None] | None, wall_offset: float) -> None:
        """Evaluate after round ``r`` (every rank takes part); the server appends the row to
        ``curve``, hands it to ``on_eval`` and updates ``best`` in place."""
        g = self.graph
        pred = self._predict(params)
        if pred is None:  # a client rank: the server evaluates
            return
        row = {"round": r + 1, "val_acc": self._acc(pred, g.val_mask), "test_acc": self._acc(pred, g.test_mask),
               "uplink_bytes": self.tally.uplink, "downlink_bytes": self.tally.downlink,
               "embedding_bytes": self.tally.embeddings, "evaluation_bytes": self.tally.evaluation,
               "wall_s": time.perf_counter() + wall_offset}
        if self.accountant is not None:
            row["epsilon"] = self.accountant.epsilon()
        if self.adaptive is not None:
            row["clip"] = self.adaptive.clip  # what the next round clips to
        curve.append(row)
        if on_eval:
            on_eval(row)
        if row["val_acc"] > best["val"] or best["pred"] is None:
            best.clear()
            best.update(val=row["val_acc"], round=r + 1, pred=pred, test=row["test_acc"])

    def _summary(self, best: dict[str, Any], curve: list[dict[str, Any]], wall: float) -> dict[str, Any]:
        cfg, g = self.cfg, self.graph
        fair = fairness_report(best["pred"], g.y, g.test_mask, self.owner, self.degree,
                               self.tally.by_client or None)
        rounds = cfg.federated.rounds
        out: dict[str, Any] = {
            "dataset": cfg.data.dataset, "algorithm": cfg.federated.algorithm, "clients": self.n_clients,
            "split": cfg.split.method, "test_acc": best["test"], "best_val_acc": best["val"],
            "best_round": best["round"], "rounds": rounds, "worst_client_acc": (fair["worst_client"] or {}).get("accuracy"),
            "uplink_bytes_total": self.tally.uplink, "uplink_payload_bytes_total": self.tally.payload_uplink,
            "uplink_bytes_per_round": self.tally.uplink / rounds, "downlink_bytes_total": self.tally.downlink,
            "embedding_bytes_total": self.tally.embeddings, "evaluation_bytes_total": self.tally.evaluation,
            "params": self.dim,
            "secure_agg": cfg.secagg.enabled, "secagg_s": self.tally.secagg_s,
            "train_s": self.tally.train_s if self.t.world == 1 else None,  # known where every client runs
            "wall_s": wall, "ranks": self.t.world, "fairness": fair, "split_stats": split_stats(g, self.owner), "gate": self.gate.report(),
            "curve": curve,
        }
        if self.neighgen_report is not None:
            out["neighgen"] = self.neighgen_report
        if self.accountant is not None:
            rep = self.accountant.report()
            if self.adaptive is not None:  # the noise split and the range the clip moved in
                rep["adaptive_clip"] = {"update_noise_multiplier": self.sigma, "count_stddev": self.adaptive.count_stddev,
                                        "target_quantile": cfg.dp.target_quantile, "start": cfg.dp.clip,
                                        "ceiling": cfg.dp.clip_ceiling}
            rep["noise"] = ("seeded: reproducible_noise is on, and anyone with config.toml can regenerate it "
                            "(not private)" if cfg.dp.reproducible_noise else "secret seeds (secrets.randbits)")
            out.update(epsilon=rep["epsilon"], delta=rep["delta"], dp=rep)
        return out
