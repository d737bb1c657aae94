"""Functions run on gloo ranks by tests/test_minibatch.py (spawned children import them)."""

from __future__ import annotations

import threading
from typing import Any

import torch

from commgnn.comm.config import CommConfig
from commgnn.distributed.context import DistContext
from commgnn.distributed.events import CommEvent, Hooks, TimeEvent
from commgnn.fetch.row_cache import LRUCache, StaticCache
from commgnn.fetch.config import FetchConfig
from commgnn.fetch.fetcher import FeatureFetcher
from commgnn.models import ModelConfig
from commgnn.partition import build_local_partition
from commgnn.sampling.config import SamplerConfig
from commgnn.sampling.csr import CSRTopology
from commgnn.sampling.remote import RemoteNeighbors
from commgnn.sampling.saint import SaintSampler
from commgnn.trainers import FullGraphTrainer, TrainConfig
from commgnn.trainers.layerwise import LayerwiseInference
from commgnn.trainers.mb_setup import own_in_edges, owner_map
from commgnn.trainers.minibatch import MiniBatchTrainer


def random_parts(n: int, P: int, seed: int = 0) -> torch.Tensor:
    """A random assignment of ``n`` nodes to ``P`` ranks."""
    return torch.randint(0, P, (n,), generator=torch.Generator().manual_seed(seed))


def small_cfgs() -> tuple[ModelConfig, TrainConfig]:
    """The small GraphSAGE and its training settings of the mini-batch tests."""
    return ModelConfig(name="sage", hidden=8, dropout=0.0), TrainConfig(epochs=3, lr=0.01, weight_decay=0.0)


def mkdir(path: Any) -> Any:
    """``path``, created (one run directory per ``run_on_ranks`` call)."""
    path.mkdir()
    return path


def _counting_hooks() -> tuple[Hooks, list[CommEvent]]:
    hooks, events = Hooks(), []
    hooks.subscribe(lambda ev: events.append(ev) if isinstance(ev, CommEvent) else None)
    return hooks, events


def fetch_rows(ctx: DistContext, data: Any, parts: torch.Tensor, bits: int, policy: str | None,
               steps: int, sparse: bool = False) -> dict[str, Any]:
    """Fetch random id sets; return what was served and the true rows, and the bytes."""
    part = build_local_partition(data, parts, ctx.world_size, ctx.rank)
    hooks, events = _counting_hooks()
    owner, row = owner_map(ctx, hooks, part)
    N, F = data.x.shape
    cache = None
    if policy == "lru":
        cache = LRUCache(N, 20, F, torch.float32)
    elif policy == "static":
        remote = (owner != ctx.rank).nonzero().flatten()
        cache = StaticCache(N, remote[:15], F, torch.float32)
    fetcher = FeatureFetcher(ctx, hooks, table=part.x, owner=owner, row=row, cache=cache, bits=bits, seed=ctx.rank,
                             sparse=sparse)
    if isinstance(cache, StaticCache):
        cache.fill(fetcher.fetch(cache.ids, kind="fetch_setup", use_cache=False))
    events.clear()
    g = torch.Generator().manual_seed(100 + ctx.rank)
    served, asked, n_remote = [], [], 0
    for _ in range(steps):
        ids = torch.randperm(N, generator=g)[: int(torch.randint(0, N // 2, (1,), generator=g))]
        served.append(fetcher.fetch(ids))
        asked.append(ids)
        n_remote += int((owner[ids] != ctx.rank).sum())
    rows_bytes = sum(e.nbytes for e in events if e.kind == "fetch_rows")
    return {"served": served, "asked": asked, "rows_bytes": rows_bytes, "fetched": fetcher.rows_fetched,
            "requested": fetcher.rows_requested, "n_remote": n_remote,
            "hits": cache.reset_stats()["hits"] if cache is not None else 0,
            "ids_bytes": sum(e.nbytes for e in events if e.kind == "fetch_ids"), "saved": fetcher.bytes_saved}


def fetch_one_sided(ctx: DistContext, data: Any, parts: torch.Tensor, sparse: bool = False) -> list[torch.Tensor]:
    """Rank 0 asks only for its own rows (then for none); the others ask for rank 0's rows."""
    part = build_local_partition(data, parts, ctx.world_size, ctx.rank)
    hooks, _ = _counting_hooks()
    owner, row = owner_map(ctx, hooks, part)
    fetcher = FeatureFetcher(ctx, hooks, table=part.x, owner=owner, row=row, sparse=sparse)
    of_rank0 = (owner == 0).nonzero().flatten()
    served = []
    for ids in (of_rank0[:5], of_rank0[:0]):
        served.append(fetcher.fetch(ids if ctx.rank == 0 else of_rank0[-5:]))
    return served


def remote_sampling(ctx: DistContext, data: Any, parts: torch.Tensor, fanout: int, rounds: int) -> list[Any]:
    """Owner-side sampling of random frontiers; return (nodes, src, pos) per round."""
    part = build_local_partition(data, parts, ctx.world_size, ctx.rank)
    hooks = Hooks()
    owner, row = owner_map(ctx, hooks, part)
    own_csr = CSRTopology.from_edge_index(torch.stack([own_in_edges(part)[0], part.edge_index[1]]), part.num_owned)
    src_of = RemoteNeighbors(ctx, hooks, own_csr=own_csr, owner=owner, row=row, replace=False,
                             generator=torch.Generator().manual_seed(ctx.rank))
    g = torch.Generator().manual_seed(7 + ctx.rank)
    out = []
    for i in range(rounds):
        k = 0 if i == 0 else int(torch.randint(1, data.num_nodes, (1,), generator=g))  # round 0: empty on all
        nodes = torch.randperm(data.num_nodes, generator=g)[:k]
        src, pos = src_of(nodes, fanout, g)
        out.append((nodes, src, pos))
    return out


def remote_in_edges(ctx: DistContext, data: Any, parts: torch.Tensor, rounds: int) -> dict[str, Any]:
    """Whole in-edge lists of random node sets from their owners; the topology bytes sent."""
    from commgnn.trainers.mb_setup import remote_in_edges as build

    part = build_local_partition(data, parts, ctx.world_size, ctx.rank)
    hooks, events = _counting_hooks()
    owner, row = owner_map(ctx, hooks, part)
    own_csr = CSRTopology.from_edge_index(torch.stack([own_in_edges(part)[0], part.edge_index[1]]), part.num_owned)
    edges = build(ctx, hooks, own_csr, owner, row)
    events.clear()
    g = torch.Generator().manual_seed(11 + ctx.rank)
    out = []
    for i in range(rounds):
        k = 0 if i == 0 else int(torch.randint(1, data.num_nodes, (1,), generator=g))  # round 0: empty on all
        nodes = torch.randperm(data.num_nodes, generator=g)[:k]
        out.append((nodes, *edges.neighbours_of(nodes)))
    return {"rounds": out, "deg": edges.in_degree(), "bytes": sum(e.nbytes for e in events),
            "remote_edges": sum(int(edges.in_degree()[n][owner[n] != ctx.rank].sum()) for n, *_ in out)}


def saint_both_topologies(ctx: DistContext, data: Any, parts: torch.Tensor, kind: str, draws: int,
                          empty_rank: int = -1) -> dict[str, Any]:
    """GraphSAINT batches of one seed over the replicated CSR and over a partitioned topology
    (every rank makes the same calls; the replicated sampler draws no collective), with each
    partitioned batch's global edge ids (one more round) and the normalisation counts.
    ``empty_rank`` gives its sampler no own node (its partition itself cannot be empty)."""
    from commgnn.sampling.remote_edges import PartitionedEdges
    from commgnn.trainers.mb_setup import remote_in_edges

    part = build_local_partition(data, parts, ctx.world_size, ctx.rank)
    hooks, _ = _counting_hooks()
    owner, row = owner_map(ctx, hooks, part)
    own_csr = CSRTopology.from_edge_index(torch.stack([own_in_edges(part)[0], part.edge_index[1]]), part.num_owned)
    walker = RemoteNeighbors(ctx, hooks, own_csr=own_csr, owner=owner, row=row, replace=True,
                             generator=torch.Generator().manual_seed(50 + ctx.rank))
    topologies = {"replicated": CSRTopology.from_edge_index(data.edge_index, data.num_nodes),
                  "partitioned": PartitionedEdges(remote_in_edges(ctx, hooks, own_csr, owner, row), walker)}
    own, train = part.global_ids, part.train_mask
    if ctx.rank == empty_rank:
        own, train = own[:0], train[:0]
    out: dict[str, Any] = {"own": own}
    for name, topo in topologies.items():
        s = RecordingSaint(topo, own, train, kind=kind, num_layers=2, budget=8,
                           walk_length=2, presample=10, seed=3)  # type: ignore[arg-type]
        g = torch.Generator().manual_seed(7)
        batches = []
        for b in s.epoch(draws, g):
            batch = (b.nodes, b.blocks[0].edge_index, b.blocks[0].weight, b.target, b.target_weight)
            if name == "partitioned":  # the global ids of the batch's edges (a round every rank enters)
                src, pos, eid = topo.in_edges(b.nodes)  # type: ignore[union-attr]
                batch += (src, pos, eid)
            batches.append(batch)
        out[name] = batches
        out[name + "_counts"] = (s.node_count, s.edge_count, s.edge_count_ids, s.deg)
        out[name + "_presampled"] = s.__dict__.get("drawn", [])[:10]  # the pre-sampling's draws, to recount from the graph
    return out


class RecordingSaint(SaintSampler):
    """A GraphSAINT sampler that keeps every draw's nodes (the constructor's pre-sampling
    draws come first), so a test can recount ``C_v`` and ``C_e`` from the graph itself."""

    def draw(self, generator: torch.Generator) -> torch.Tensor:
        nodes = super().draw(generator)
        self.__dict__.setdefault("drawn", []).append(nodes.clone())
        return nodes


def train_minibatch(ctx: DistContext, data: Any, parts: torch.Tensor, model_cfg: ModelConfig,
                    train_cfg: TrainConfig, sampler_cfg: SamplerConfig, fetch_cfg: FetchConfig,
                    epochs: int, comm_cfg: CommConfig | None = None) -> dict[str, Any]:
    """Train a few epochs; return weights, steps, the targets each epoch trained on, logs,
    and the bytes this rank sent by traffic class."""
    part = build_local_partition(data, parts, ctx.world_size, ctx.rank)
    hooks, events = _counting_hooks()
    main_thread, background = threading.get_ident(), {}  # timed phases run off the training thread

    def off_main(ev: Any) -> None:
        if isinstance(ev, TimeEvent) and threading.get_ident() != main_thread:
            background[ev.phase] = background.get(ev.phase, 0) + 1

    hooks.subscribe(off_main)
    t = MiniBatchTrainer(ctx, part, model_cfg, train_cfg, hooks, sampler_cfg=sampler_cfg, fetch_cfg=fetch_cfg,
                         comm_cfg=comm_cfg or CommConfig())
    trained: list[torch.Tensor] = []  # the targets of the batches each epoch trained on
    batches = t._batches

    def recording() -> Any:
        for batch, rows in batches():
            trained.append(batch.output_nodes[batch.target])
            yield batch, rows

    t._batches = recording  # type: ignore[method-assign]
    covered, results, logs = [], [], []
    for _ in range(epochs):
        results.append(t.step())
        logs.append(t.epoch_log())
        covered.append(torch.cat(trained) if trained else torch.empty(0, dtype=torch.int64))
        trained.clear()
    sent: dict[str, int] = {}
    for e in events:
        sent[e.kind] = sent.get(e.kind, 0) + e.nbytes
    return {"state": {k: v.clone() for k, v in t.model.state_dict().items()}, "steps": t.steps,
            "covered": covered, "own_train": part.global_ids[part.train_mask], "results": results, "logs": logs,
            "sent": sent, "background": background}


COLLECTIVES = ("all_to_all_single", "all_to_all", "all_reduce", "all_gather", "all_gather_into_tensor",
               "broadcast", "reduce_scatter_tensor", "barrier", "send", "recv", "batch_isend_irecv")
"""(``isend``/``irecv`` are not wrapped: ``P2POp`` accepts only the originals; gloo's exchanges
post theirs in one ``batch_isend_irecv``.)"""


def count_collectives(ctx: DistContext, data: Any, parts: torch.Tensor, model_cfg: ModelConfig,
                      train_cfg: TrainConfig, sampler_cfg: SamplerConfig, fetch_cfg: FetchConfig) -> dict[str, Any]:
    """One training epoch (no evaluation) with every ``torch.distributed`` call of
    :data:`COLLECTIVES` counted by name; the steps and the remote rows it requested."""
    import torch.distributed as dist

    part = build_local_partition(data, parts, ctx.world_size, ctx.rank)
    t = MiniBatchTrainer(ctx, part, model_cfg, train_cfg, Hooks(), sampler_cfg=sampler_cfg, fetch_cfg=fetch_cfg,
                         comm_cfg=CommConfig())
    counts: dict[str, int] = {}
    originals = {name: getattr(dist, name) for name in COLLECTIVES}

    def counting(name: str, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            counts[name] = counts.get(name, 0) + 1
            return fn(*args, **kwargs)
        return call

    t.fetcher.rows_requested = 0
    for name, fn in originals.items():
        setattr(dist, name, counting(name, fn))
    try:
        t.train_step()
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)
    return {"steps": t.steps, "counts": counts, "remote": t.fetcher.rows_requested}


def train_fullgraph(ctx: DistContext, data: Any, parts: torch.Tensor, model_cfg: ModelConfig,
                    train_cfg: TrainConfig, epochs: int) -> dict[str, Any]:
    part = build_local_partition(data, parts, ctx.world_size, ctx.rank)
    t = FullGraphTrainer(ctx, part, model_cfg, train_cfg, Hooks())
    for _ in range(epochs):
        t.step()
    return {"state": {k: v.clone() for k, v in t.model.state_dict().items()}}


def fetch_adaptive(ctx: DistContext, data: Any, parts: torch.Tensor, budget: float, epochs: int,
                   steps: int) -> dict[str, Any]:
    """Fetch random id sets over epochs with adaptive widths; rows, bytes and widths per epoch."""
    part = build_local_partition(data, parts, ctx.world_size, ctx.rank)
    hooks, events = _counting_hooks()
    owner, row = owner_map(ctx, hooks, part)
    N = data.x.shape[0]
    fetcher = FeatureFetcher(ctx, hooks, table=part.x, owner=owner, row=row, bits="adaptive", budget_bytes=budget,
                             seed=ctx.rank)
    g = torch.Generator().manual_seed(100 + ctx.rank)
    out: dict[str, Any] = {"asked": [], "served": [], "bits": [], "received": []}
    for _ in range(epochs):
        events.clear()
        out["bits"].append(list(fetcher.adaptive.bits))
        for _ in range(steps):
            ids = torch.randperm(N, generator=g)[: N // 2]
            out["asked"].append(ids)
            out["served"].append(fetcher.fetch(ids))
        out["received"].append(sum(e.nbytes for e in events if e.kind == "fetch_rows"))  # bytes this rank sent
        fetcher.end_epoch()
    return out


def fetch_adaptive_after_fill(ctx: DistContext, data: Any, parts: torch.Tensor, budget: float) -> list[list[int]]:
    """The widths an adaptive fetcher picks after one epoch, without and with a cache-fill
    style ``fetch_setup`` round before it (which must not count as the epoch's traffic)."""
    part = build_local_partition(data, parts, ctx.world_size, ctx.rank)
    hooks, _ = _counting_hooks()
    owner, row = owner_map(ctx, hooks, part)
    N = data.x.shape[0]
    picked = []
    for fill in (False, True):
        fetcher = FeatureFetcher(ctx, hooks, table=part.x, owner=owner, row=row, bits="adaptive",
                                 budget_bytes=budget, seed=ctx.rank)
        if fill:
            fetcher.fetch(torch.arange(N), kind="fetch_setup", use_cache=False)
        g = torch.Generator().manual_seed(100 + ctx.rank)
        for _ in range(4):
            fetcher.fetch(torch.randperm(N, generator=g)[: N // 2])
        fetcher.end_epoch()
        picked.append(list(fetcher.adaptive.bits))
    return picked


def request_rounds(ctx: DistContext, m: int) -> dict[str, Any]:
    """Ask random owners for random rows (``serve`` answers ``[row, 10 row + owner]``), once
    in request order and once left in owner order."""
    from commgnn.distributed.request import request_reply, request_reply_sorted
    hooks, events = _counting_hooks()
    g = torch.Generator().manual_seed(7 + ctx.rank)
    owners = torch.randint(0, ctx.world_size, (m,), generator=g)
    reqs = torch.randint(0, 1000, (m,), generator=g)

    def serve(got: torch.Tensor) -> torch.Tensor:
        return torch.stack([got, 10 * got + ctx.rank], dim=1)

    plain = request_reply(ctx, hooks, owners, reqs, serve, req_kind="fetch_ids", rep_kind="fetch_rows")
    plain_bytes = sum(e.nbytes for e in events)
    events.clear()
    back, order = request_reply_sorted(ctx, hooks, owners, reqs, serve, req_kind="fetch_ids", rep_kind="fetch_rows")
    return {"owners": owners, "reqs": reqs, "plain": plain, "back": back, "order": order,
            "plain_bytes": plain_bytes, "sorted_bytes": sum(e.nbytes for e in events)}


def layerwise_against_full(ctx: DistContext, data: Any, parts: torch.Tensor, model_cfg: ModelConfig,
                           train_cfg: TrainConfig, chunk: int) -> dict[str, Any]:
    """One training epoch, then this rank's scores and layer-0 embeddings from the
    full-graph forward and from the layer-wise one (``chunk`` rows a chunk), the bytes the
    rank sent in one layer-wise prediction, and its evaluation counts (layer-wise)."""
    part = build_local_partition(data, parts, ctx.world_size, ctx.rank)
    hooks, events = _counting_hooks()
    t = MiniBatchTrainer(ctx, part, model_cfg, train_cfg, hooks, fetch_cfg=FetchConfig(),
                         sampler_cfg=SamplerConfig(fanout=(3,) * model_cfg.layers, batch_size=8, inference="full",
                                                   inference_chunk=chunk))
    t.step()
    full, full_h = t.predict(), t.predict(layer=0)
    t.layerwise = LayerwiseInference(ctx, hooks, t.model, t.part, t.x, t.owner, t.row, chunk)
    events.clear()
    lw = t.predict()
    eval_bytes = sum(e.nbytes for e in events if e.kind == "halo_eval")
    lw_h = t.predict(layer=0)
    # chosen rows (none on rank 0 of several): their receptive field alone, the same values
    pick = (torch.arange(part.num_owned) if ctx.world_size == 1 or ctx.rank else torch.empty(0, dtype=torch.int64))
    pick = pick[part.global_ids.cpu()[pick] % 3 == 1] if ctx.world_size > 1 else pick[::4]
    # the features of the receptive field read into memory (share 1), or summed by their owners (share 0)
    from commgnn.trainers import layerwise as lw_module
    picked = {}
    for share in (1.0, 0.0):
        lw_module.COMPACT_SHARE = share
        picked[share] = (t.predict(rows=pick), t.predict(layer=1, rows=pick), t.predict(layer=0, rows=pick))
    lw_module.COMPACT_SHARE = 0.25
    return {"full": full, "lw": lw, "full_h": full_h, "lw_h": lw_h, "counts": t.evaluate(),
            "pick": pick, "picked": picked,
            "lw_1": t.predict(layer=1),
            "eval_bytes": eval_bytes, "halo": part.num_halo, "own": part.num_owned, "y": part.y,
            "masks": torch.stack([part.train_mask, part.val_mask, part.test_mask])}


def sampled_against_exact(ctx: DistContext, data: Any, parts: torch.Tensor, model_cfg: ModelConfig,
                          train_cfg: TrainConfig, topology: str, fanout: tuple[int, ...]) -> dict[str, Any]:
    """Two trainers of one config but the inference (exact ``full`` and ``sampled``), each
    trained 2 epochs: their evaluation counts after each epoch, and their final weights."""
    part = build_local_partition(data, parts, ctx.world_size, ctx.rank)
    out: dict[str, Any] = {}
    for inference in ("full", "sampled"):
        t = MiniBatchTrainer(ctx, part, model_cfg, train_cfg, Hooks(), fetch_cfg=FetchConfig(),
                             sampler_cfg=SamplerConfig(fanout=fanout, batch_size=8, topology=topology,
                                                       inference=inference))
        counts = []
        for _ in range(2):
            t.step()
            counts.append(t.evaluate())
        out[inference] = {"counts": torch.stack(counts), "again": t.evaluate(),
                          "weights": {k: v.clone() for k, v in t.model.state_dict().items()}}
    out["masks"] = torch.stack([part.train_mask, part.val_mask, part.test_mask]).sum(1)
    return out


def sampled_subset(ctx: DistContext, data: Any, parts: torch.Tensor, model_cfg: ModelConfig,
                   train_cfg: TrainConfig, eval_nodes: int) -> dict[str, Any]:
    """A trainer evaluating by sampling every neighbour (fan-out -1) on ``eval_nodes`` of
    each split, trained one epoch: its counts, the rows it scored, and the exact predictions."""
    part = build_local_partition(data, parts, ctx.world_size, ctx.rank)
    t = MiniBatchTrainer(ctx, part, model_cfg, train_cfg, Hooks(), fetch_cfg=FetchConfig(),
                         sampler_cfg=SamplerConfig(fanout=(-1, -1), batch_size=8, inference="sampled",
                                                   eval_nodes=eval_nodes))
    t.step()
    counts = t.evaluate()
    return {"counts": counts, "again": t.evaluate(), "rows": t._eval_rows, "scored": t.eval_scored,
            "pred": t.predict().argmax(1), "y": part.y.clone(),
            "masks": torch.stack([part.train_mask, part.val_mask, part.test_mask]).sum(1),
            "log": t.epoch_log()}


def exchange(ctx: DistContext, width: int) -> dict[str, Any]:
    """``commgnn.distributed.request.all_to_all`` of rows ``width`` floats wide, with uneven
    counts (rank r sends ``r + q + 1`` rows to rank q, none to itself on rank 0)."""
    from commgnn.distributed.request import all_to_all

    P, r = ctx.world_size, ctx.rank
    out_counts = [0 if (r == 0 and q == 0) else r + q + 1 for q in range(P)]
    in_counts = [0 if (r == 0 and q == 0) else q + r + 1 for q in range(P)]
    rows = [torch.full((out_counts[q], width), float(100 * r + q)) for q in range(P)]
    return {"got": all_to_all(ctx, None, torch.cat(rows), out_counts, in_counts), "in_counts": in_counts}
