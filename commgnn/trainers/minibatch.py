"""Distributed mini-batch training: every rank samples from its own training nodes,
fetches the remote feature rows of its batch in one round, and takes the same number of
steps; gradients sync once per step with any ``[comm.grad]`` / ``[comm.gossip]`` strategy.

**Equal steps.** ``steps = max_r num_batches_r`` (one all-reduce at set-up). Each rank cuts
its epoch's units (seed nodes, clusters) into exactly ``steps`` near-equal chunks
(:func:`~commgnn.sampling.base.split_evenly`): the rank with the most training nodes takes
batches of ``batch_size``, the others smaller ones (or empty ones), so every training node
is a seed exactly once per epoch, nothing is dropped or repeated, and every rank enters
every collective of every step (a rank with an empty batch still fetches nothing and
syncs zero gradients). GraphSAINT takes ``steps`` independent draws.

**Loss.** Rank r's share of step s is ``scale * sum_{v in targets} w_v CE_v`` with
``scale = steps / n_train`` (``n_train`` over all ranks) for samplers that visit every
node once per epoch (the shares summed over ranks estimate the mean training loss), and
``scale = 1 / n_train`` with ``w_v = 1 / p_v`` for GraphSAINT, whose one draw already
estimates the full sum. Gradient strategies sum over ranks, as in full-graph training.

**Evaluation** is the full-graph trainer's: exact, layer by layer with the halo exchange,
on the same :class:`~commgnn.models.net.PartitionGNN` weights, so accuracies compare
one to one with full-graph runs.

Per-epoch log: steps, sampled nodes and edges per step (mean over ranks and steps), cache
requests and hits, the bytes the hits saved, the hit rate and that of the offline-optimal
static cache of the same size on the epoch's own request trace (and Belady's dynamic
optimum), rows fetched, and the training-loop time.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from commgnn.comm.config import CommConfig
from commgnn.comm.halo.alltoall import AllToAllHalo
from commgnn.comm.halo.sparse_setup import SparseSetup
from commgnn.distributed.context import DistContext
from commgnn.distributed.events import Hooks
from commgnn.errors import ConfigError, UserError
from commgnn.fetch.row_cache import RowCache, StaticCache
from commgnn.fetch.config import FetchConfig
from commgnn.fetch.fetcher import FeatureFetcher
from commgnn.fetch.optimal import belady_hit_rate, optimal_static_hit_rate
from commgnn.models.blocks import SAMPLED_MODELS, BlockGNN, BlockGraph
from commgnn.models.config import ModelConfig
from commgnn.models.net import layer_dims
from commgnn.models.vrgcn import VRGCN, History
from commgnn.partition.local import LocalPartition
from commgnn.sampling.base import MiniBatch
from commgnn.sampling.config import SamplerConfig
from commgnn.sampling.remote import RemoteNeighbors
from commgnn.sampling.remote_edges import PartitionedEdges, RemoteInEdges
from commgnn.trainers.config import TrainConfig, stream_seed
from commgnn.trainers.fullgraph import FullGraphTrainer, halo_plan
from commgnn.trainers.nonfinite import guard_step
from commgnn.trainers.layerwise import LayerwiseInference
from commgnn.trainers.sampled_eval import SampledInference
from commgnn.trainers.mb_setup import (available_memory, build_cache, build_sampler, cache_capacity, choose_topology,
                                       inference_mode, keeps_half_features, owner_map, remote_candidates,
                                       replicated_topology, sampler_reach)

BELADY_LIMIT = 3_000_000
"""Requests per epoch above which Belady's optimum (a Python-level heap walk) is skipped."""


class MiniBatchTrainer(FullGraphTrainer):
    """Sampled training on one rank; all ranks run it in lockstep."""

    def __init__(self, ctx: DistContext, part: LocalPartition, model_cfg: ModelConfig, train_cfg: TrainConfig,
                 hooks: Hooks, *, sampler_cfg: SamplerConfig, fetch_cfg: FetchConfig,
                 comm_cfg: CommConfig | None = None) -> None:
        if model_cfg.name not in SAMPLED_MODELS:
            raise ConfigError(f"sampler '{sampler_cfg.sampler}' does not fit model '{model_cfg.name}': mini-batch "
                              f"training runs {', '.join(SAMPLED_MODELS)} (use --model sage)")
        self.sampler_cfg, self.fetch_cfg = sampler_cfg, fetch_cfg
        self.vr = sampler_cfg.sampler == "vrgcn"
        super().__init__(ctx, part, model_cfg, train_cfg, hooks, comm_cfg=comm_cfg,
                         half_input=keeps_half_features(sampler_cfg, fetch_cfg))
        # Evaluation's exchanges count their bytes but not their time as comm: in mini-batch
        # logs comm_s is the gradient sync alone, and evaluation is part of compute_s.
        self.eval_halo = AllToAllHalo(ctx, halo_plan(self.part), hooks.bytes_only())
        if self.halo_cfg.sparse_setup:
            self.eval_halo = SparseSetup(self.eval_halo)
        cpu = self.part.to("cpu")
        self.owner, self.row = owner_map(ctx, hooks, cpu)
        edges = ctx.all_reduce(torch.tensor([float(cpu.num_edges)], dtype=torch.float64))
        self.available = available_memory(ctx)
        self.topology = choose_topology(sampler_cfg, cpu.num_nodes_global, int(edges[0]), ctx.local_world_size,
                                        self.available)
        csr = replicated_topology(ctx, hooks, cpu) if self.topology == "replicated" else None
        self.inference = inference_mode(ctx, sampler_cfg, cpu, model_cfg, self.dtype.itemsize, self.available)
        """``full``, ``layerwise`` or ``sampled``: how :meth:`evaluate` and :meth:`predict` run (``minibatch.inference``)."""
        if self.inference in ("layerwise", "sampled"):  # sampled: predict and embeddings stay exact
            self.layerwise = LayerwiseInference(ctx, hooks.bytes_only(), self.model, self.part, self.x, self.owner,
                                                self.row, sampler_cfg.inference_chunk)
        layers = len(self.model.convs)
        self.sampler = build_sampler(sampler_cfg, ctx, hooks, cpu, layers=layers, csr=csr, owner=self.owner,
                                     row=self.row, seed=train_cfg.seed)
        self.gen = torch.Generator().manual_seed(stream_seed(train_cfg.seed, ctx.rank, "train"))
        steps = ctx.all_reduce(torch.tensor([float(self.sampler.num_batches())], dtype=torch.float64), "max")
        self.steps = max(1, int(steps[0]))
        self.n_train = float(self.split_sizes[0])
        table = self.x
        if self.vr:  # [x | mean_N x]: layer 0's exact aggregate travels with the features
            x_src = torch.cat([self.x, self.eval_halo.exchange(self.x, 0, kind="halo_setup")])
            table = torch.cat([self.x, self.model.convs[0].precompute(x_src, self.graph)], dim=1)
        self.cache: RowCache | None = None
        # The optimum is computed for the configured size (``capacity``) even where a presample
        # cache holds fewer rows (only rows requested in pre-sampling): same budget, same comparison.
        self.capacity = 0
        if fetch_cfg.cached and ctx.is_distributed:
            self.cache, self.capacity = self._build_cache(cpu, csr, layers, table)
        self.fetcher = FeatureFetcher(ctx, hooks, table=table, owner=self.owner, row=self.row, cache=self.cache,
                                      bits=fetch_cfg.bits, budget_bytes=fetch_cfg.budget_mb * 1e6,
                                      seed=stream_seed(train_cfg.seed, ctx.rank, "fetch"), sparse=fetch_cfg.sparse,
                                      record_trace=self.capacity > 0)  # the trace feeds the cache comparisons only
        if isinstance(self.cache, StaticCache):  # one set-up fetch of the chosen rows
            self.cache.fill(self.fetcher.fetch(self.cache.ids, kind="fetch_setup", use_cache=False))
            self.fetcher.rows_requested = self.fetcher.rows_fetched = 0
        self.prefetch_group = None
        if fetch_cfg.prefetch and ctx.is_distributed:
            # Background fetches get their own communicator (created in the same order on every rank).
            self.prefetch_group = ctx.new_group()
        self._stats = torch.zeros(4, dtype=torch.float64)  # sampled nodes, edges, batches, train seconds
        self._step_s = torch.zeros(0, dtype=torch.float64)  # the last epoch's step wall times
        self.sampled: SampledInference | None = None
        self._eval_rows: list[Tensor] | None = None  # the rows sampled evaluation scores (drawn once)
        self.eval_scored: Tensor | None = None
        """``[3]`` nodes of (train, val, test) that sampled evaluation scores, over all ranks."""
        """Evaluation by neighbour sampling (``minibatch.inference = "sampled"``)."""
        if self.inference == "sampled":
            remote = _remote_source(self.sampler)
            self.sampled = SampledInference(
                ctx, source=self.sampler.source, fanout=sampler_cfg.fanout, batch_size=sampler_cfg.batch_size,
                global_ids=cpu.global_ids, row=self.row, seed=stream_seed(train_cfg.seed, ctx.rank, "eval"),
                streams=[remote.gen] if remote is not None else [],
                fetch=lambda ids: self.fetcher.fetch(ids, kind="halo_eval", use_cache=False),
                forward=lambda rows, batch: self.net(rows.to(self.dtype), batch, _graphs(batch, self.cfg.resolved_kernel)))

    def _correct_counts(self) -> Tensor:
        """The exact pass of the base class, or with ``minibatch.inference = "sampled"`` each
        split's nodes scored by neighbour sampling (:mod:`commgnn.trainers.sampled_eval`);
        with ``minibatch.eval_nodes`` a fixed subset of each, its count scaled to the split."""
        if self.sampled is None:
            return super()._correct_counts()
        self.net.eval()
        if self._eval_rows is None:
            self._eval_rows = self._pick_eval_rows()
        counts = []
        for mask, rows in zip((self.part.train_mask, self.part.val_mask, self.part.test_mask), self._eval_rows):
            scores = self.sampled.scores(rows)
            hit = (scores.argmax(dim=1) == self.part.y[rows]).sum().to(torch.float64) if rows.numel() \
                else torch.zeros((), dtype=torch.float64)
            owned = float(mask.sum())
            counts.append(hit * (owned / rows.numel()) if rows.numel() else hit)  # the split's estimate
        return torch.stack(counts)

    def _pick_eval_rows(self) -> list[Tensor]:
        """Each split's owned rows that sampled evaluation scores: all of them, or with
        ``minibatch.eval_nodes = k`` a fixed random ``ceil(k n_r / n)`` of this rank's ``n_r``
        (``n`` over all ranks), drawn once from the ``eval_pick`` stream."""
        k = self.sampler_cfg.eval_nodes
        gen = torch.Generator().manual_seed(stream_seed(self.cfg.seed, self.ctx.rank, "eval_pick"))
        picked = []
        for mask, total in zip((self.part.train_mask, self.part.val_mask, self.part.test_mask),
                               self.split_sizes.tolist()):
            rows = mask.cpu().nonzero().flatten()
            if k and total > k:
                share = min(rows.numel(), math.ceil(k * rows.numel() / total))
                rows = rows[torch.randperm(rows.numel(), generator=gen)[:share]].sort().values
            picked.append(rows)
        scored = torch.tensor([float(r.numel()) for r in picked], dtype=torch.float64)
        self.eval_scored = self._reduce(scored) if self.ctx.is_distributed else scored
        return picked

    def _forward_module(self) -> nn.Module:
        if self.vr:
            widths = [d_in for d_in, _ in layer_dims(self.model.cfg, self.x.shape[1], self.part.num_classes)[1:]]
            self.history = History(self.part.num_nodes_global, widths, self.x.dtype)
            return VRGCN(self.model, self.history, replace=self.sampler_cfg.replace)
        return BlockGNN(self.model, sparse_input=self._sparse_input(self.cfg.sparse_input))

    def _build_cache(self, cpu: LocalPartition, csr: Any, layers: int, table: Tensor) -> tuple[RowCache, int]:
        """The cache of ``fetch_cfg`` and its configured size in rows."""
        cfg = self.fetch_cfg
        frontier, hops = sampler_reach(self.sampler_cfg, layers)
        candidates = remote_candidates(cpu, csr, self.owner, hops, frontier=frontier)
        capacity = cache_capacity(cfg, int(candidates.numel()), table.shape[1], table.element_size(),
                                  self.ctx.local_world_size, self.available)
        capacity = min(capacity, int(candidates.numel()))
        whole = [p for p in _remote_parts(self.sampler) if isinstance(p, (RemoteInEdges, PartitionedEdges))]
        if csr is not None or whole:  # every node's in-degree: the CSR's, or the owners' (VR-GCN, GraphSAINT)
            degree = csr.in_degree() if csr is not None else whole[0].in_degree()
        else:  # partitioned neighbour sampling: the in-edges this partition holds of its halo nodes
            degree = torch.zeros(cpu.num_nodes_global, dtype=torch.int64)
            degree[cpu.halo_global_ids.cpu()] = cpu.in_degree[cpu.num_owned:].cpu()
        hotness = None
        if cfg.cache_policy == "presample":
            hotness = self._presample_hotness(cpu.num_nodes_global, cfg.presample_epochs)
        return build_cache(cfg, capacity=capacity, candidates=candidates, degree=degree, hotness=hotness,
                           num_nodes=cpu.num_nodes_global, width=table.shape[1], dtype=table.dtype), capacity

    def _presample_hotness(self, num_nodes: int, epochs: int) -> Tensor:
        """GNNLab: how often each remote row is requested over pre-sampled epochs. The
        training stream and, with a partitioned topology, the stream this rank serves its
        peers' neighbour requests from are put back afterwards, so that training samples
        exactly what it would have sampled without the cache."""
        remote = _remote_source(self.sampler)
        streams = [self.gen] + ([remote.gen] if remote is not None else [])
        saved = [g.get_state() for g in streams]
        counts = torch.zeros(num_nodes, dtype=torch.int64)
        try:
            gen = torch.Generator().manual_seed(int(torch.randint(2**31, (1,), generator=self.gen)) + 1)
            for _ in range(epochs):
                for batch in self.sampler.epoch(self.steps, gen):
                    ids = batch.nodes[self.owner[batch.nodes] != self.ctx.rank]
                    counts += torch.bincount(ids, minlength=num_nodes)
        finally:
            for g, state in zip(streams, saved):
                g.set_state(state)
        return counts

    # ------------------------------------------------------------------ training
    def _batches(self) -> Iterator[tuple[MiniBatch, Tensor]]:
        """This epoch's ``(batch, rows)``, sampled and fetched on this thread or, with
        prefetch, one step ahead on a background thread with its own communicator."""
        it = self.sampler.epoch(self.steps, self.gen)
        if self.prefetch_group is None:
            for _ in range(self.steps):
                with self.hooks.timed("sample"):
                    batch = next(it)
                with self.hooks.timed("fetch"):
                    rows = self.fetcher.fetch(batch.nodes)
                yield batch, rows
            return
        # every collective of the background thread on its own communicator: the fetch's and,
        # with a partitioned topology, the owner-side sampling's
        self.fetcher.group = self.prefetch_group
        for remote in _remote_parts(self.sampler):
            remote.group = self.prefetch_group
        with ThreadPoolExecutor(max_workers=1) as pool:
            def load() -> tuple[MiniBatch, Tensor]:
                # timed on this thread, the meter books it as overlap, not as the epoch's
                with self.hooks.timed("sample"):
                    batch = next(it)
                with self.hooks.timed("fetch"):
                    return batch, self.fetcher.fetch(batch.nodes)

            pending: Future[tuple[MiniBatch, Tensor]] = pool.submit(load)
            for step in range(self.steps):
                with self.hooks.timed("fetch"):  # only the part not hidden behind compute
                    ready = pending.result()
                if step + 1 < self.steps:
                    pending = pool.submit(load)
                yield ready

    def train_step(self) -> Tensor:
        """One epoch of ``steps`` optimiser steps; returns this rank's mean loss share."""
        self.model.train()
        self.net.train()
        total = torch.zeros((), dtype=torch.float64)
        t0 = time.perf_counter()
        params = list(self.model.parameters())
        ends = []  # each step's end: its wall time counts its sampling and fetch too
        for batch, rows in self._batches():
            self.optimizer.zero_grad(set_to_none=True)
            rows = rows.to(self.dtype)  # half-precision rows are converted here, a step's worth
            out = self.net(rows, batch) if self.vr else self.net(rows, batch, _graphs(batch, self.cfg.resolved_kernel))
            tgt = batch.target
            labels = self.part.y[self.row[batch.output_nodes[tgt]]]
            ce = F.cross_entropy(out[tgt], labels, reduction="none")
            if batch.target_weight is None:
                loss = ce.sum() * (self.steps / self.n_train)
            else:
                loss = (ce * batch.target_weight.to(ce.dtype)).sum() / self.n_train
            loss.backward()
            # before the gradients are synced or applied: "stop" raises, "skip_step" zeroes them
            skip = guard_step(self.cfg.on_nonfinite, loss, self.model, epoch=self.epoch + 1, rank=self.ctx.rank,
                              any_rank=self._reduce if self.ctx.is_distributed else None)
            self.grad_sync.set_lr(self.optimizer.param_groups[0]["lr"])
            self.grad_sync.sync(params)
            if not skip:
                self.optimizer.step()
                self.grad_sync.after_step(params)
            total += loss.detach().to(torch.float64)
            self._stats[:3] += torch.tensor([batch.num_sampled_nodes, batch.num_sampled_edges, 1.0],
                                            dtype=torch.float64)
            ends.append(time.perf_counter())
        self._step_s = torch.diff(torch.tensor([t0, *ends], dtype=torch.float64))
        self._stats[3] += time.perf_counter() - t0
        self.fetcher.end_epoch()  # an adaptive codec re-solves its widths
        if self.scheduler is not None:
            self.scheduler.step()
        return total / self.steps

    def epoch_log(self) -> dict[str, Any]:
        """Sampling and cache facts of the epoch, over all ranks (one all-gather)."""
        trace = self.fetcher.take_trace()
        requests = float(self.fetcher.remote_requests)
        self.fetcher.remote_requests = 0
        stats = self.cache.reset_stats() if self.cache is not None else {"requests": 0, "hits": 0}
        opt = belady = 0.0
        if self.capacity and requests:
            opt = optimal_static_hit_rate(trace, self.capacity) * requests
            belady = belady_hit_rate(trace, self.capacity) * requests if requests <= BELADY_LIMIT else float("nan")
        mine = torch.tensor([*self._stats.tolist(), requests, float(stats["hits"]), opt, belady,
                             float(self.fetcher.rows_fetched), float(self.fetcher.bytes_saved)], dtype=torch.float64)
        self._stats.zero_()
        self.fetcher.rows_fetched = self.fetcher.bytes_saved = 0
        rows = self.ctx.all_gather(mine)
        step_s = self.ctx.all_gather(self._step_s).max(0).values if self._step_s.numel() else self._step_s
        s = rows.sum(0)
        batches = max(float(s[2]), 1.0)
        log: dict[str, Any] = {
            "steps": self.steps, "sampled_nodes_per_step": float(s[0]) / batches,
            "sampled_edges_per_step": float(s[1]) / batches, "train_loop_s": float(rows[:, 3].max()),
            "remote_requests": int(s[4]), "rows_fetched": int(s[8]), "cache_hits": int(s[5]),
            "inference": self.inference,
            "step_s": [round(float(t), 4) for t in step_s],
        }
        if self.eval_scored is not None:
            log["eval_scored_nodes"] = [int(v) for v in self.eval_scored.tolist()]
        if self.capacity or self.cache is not None:
            log["cache_rows"] = self.capacity
            log["cache_hit_rate"] = float(s[5]) / float(s[4]) if s[4] else 0.0
            log["cache_hit_rate_optimal"] = float(s[6]) / float(s[4]) if s[4] else 0.0
            log["cache_hit_rate_belady"] = float(s[7]) / float(s[4]) if s[4] else 0.0
            log["cache_bytes_saved"] = int(s[9])
        return log

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["minibatch"] = {"gen": self.gen.get_state(), "fetcher": self.fetcher.state_dict(),
                              "history": self.history.state_dict() if self.vr else None,
                              "remote_gen": _remote_gen_state(self.sampler), "topology": self.topology}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mb = state["minibatch"]
        saved = mb.get("topology", self.topology)  # (checkpoints of earlier versions did not record it)
        if saved != self.topology:
            # topology = auto decides from the free memory at start: a resume can choose
            # otherwise, and the samples (and a cache's rows) would then not be the run's.
            raise UserError(f"this run sampled a {saved} topology, but on resuming minibatch.topology = "
                            f"'{self.sampler_cfg.topology}' chose {self.topology} (the free memory changed): "
                            f"set minibatch.topology = '{saved}' in the run's config.toml to resume it exactly")
        super().load_state_dict(state)
        self.gen.set_state(mb["gen"])
        self.fetcher.load_state_dict(mb["fetcher"])
        if self.vr and mb.get("history") is not None:
            self.history.load_state_dict(mb["history"])
        if mb.get("remote_gen") is not None:
            _remote_gen(self.sampler).set_state(mb["remote_gen"])  # type: ignore[union-attr]


def _graphs(batch: MiniBatch, kernel: str = "torch") -> list[BlockGraph]:
    """One :class:`BlockGraph` per distinct block (subgraph samplers repeat one block per
    layer: its CSR is built once)."""
    made: dict[int, BlockGraph] = {}
    return [made.setdefault(id(b.edge_index), BlockGraph(b, kernel)) for b in batch.blocks]


def _remote_parts(sampler: Any) -> list[Any]:
    """A sampler's collective parts over a partitioned topology (each has a ``group``)."""
    parts = (getattr(getattr(sampler, "inner", sampler), "source", None), getattr(sampler, "csr", None),
             getattr(sampler, "edges", None))
    return [p for p in parts if isinstance(p, (RemoteNeighbors, RemoteInEdges, PartitionedEdges))]


def _remote_source(sampler: Any) -> RemoteNeighbors | None:
    """The owner-side neighbour source of a sampler over a partitioned topology (GraphSAINT's
    walk steps), if any: its stream serves the peers' requests."""
    for part in _remote_parts(sampler):
        source = part.walker if isinstance(part, PartitionedEdges) else part
        if isinstance(source, RemoteNeighbors):
            return source
    return None


def _remote_gen(sampler: Any) -> torch.Generator | None:
    source = _remote_source(sampler)
    return source.gen if source is not None else None


def _remote_gen_state(sampler: Any) -> Tensor | None:
    gen = _remote_gen(sampler)
    return gen.get_state() if gen is not None else None
