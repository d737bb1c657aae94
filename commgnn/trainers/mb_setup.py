"""Set-up of distributed mini-batch training: who owns what, the topology, the sampler,
the cache. Each step here runs once, before the first epoch, and its traffic is set-up
traffic (reported apart from the epochs).

* **Owner map.** ``owner [N]`` (rank) and ``row [N]`` (row on the owner) from one
  all-gather of every rank's owned ids: 16 bytes a node on every rank.
* **Topology.** Replicated: every rank's in-edges (global ids) are all-gathered into one
  CSR on every rank (``topology`` bytes). Partitioned: each rank keeps its own in-edges;
  owners sample for the others (:mod:`commgnn.sampling.remote`) and serve whole in-edge
  lists to VR-GCN and GraphSAINT (:mod:`commgnn.sampling.remote_edges`), and Cluster-GCN
  reads its own. ``auto`` replicates when the CSRs of all local ranks (with GraphSAINT's
  normalisation over every edge) fit in ``topology_share`` of available memory.
* **Cache.** Its size is ``cache_mb`` or ``cache_ratio`` x the rank's *remote rows*: the
  other ranks' nodes within the model's L hops of its seeds (within reach of a sample),
  or its halo nodes under a partitioned topology. Static policies fill it once here.
"""

from __future__ import annotations

import torch
from torch import Tensor

from commgnn.distributed.context import DistContext
from commgnn.distributed.events import Hooks, TrafficClass
from commgnn.errors import ConfigError
from commgnn.fetch.row_cache import LRUCache, RowCache, StaticCache
from commgnn.fetch.config import FetchConfig
from commgnn.fetch.policies import capacity_rows, degree_ranking, hotness_ranking
from commgnn.models.config import ModelConfig
from commgnn.models.net import layer_dims
from commgnn.partition.local import LocalPartition
from commgnn.sampling.base import Sampler
from commgnn.sampling.cluster import ClusterSampler
from commgnn.sampling.config import SamplerConfig
from commgnn.sampling.csr import CSRTopology
from commgnn.sampling.neighbor import NeighborSampler, replicated_source
from commgnn.sampling.remote import RemoteNeighbors
from commgnn.sampling.remote_edges import PartitionedEdges, RemoteInEdges
from commgnn.sampling.saint import SAINT_BYTES_PER_EDGE, SaintSampler
from commgnn.sampling.vrgcn import VRGCNSampler
from commgnn.trainers.config import stream_seed
from commgnn.distributed.memory import available_bytes


def gather_variable(ctx: DistContext, hooks: Hooks, t: Tensor, kind: TrafficClass) -> list[Tensor]:
    """Every rank's ``t: [n_r, ...]`` (sizes may differ), in rank order: an all-gather of
    the sizes, then of ``t`` padded to the largest (counted as a ring all-gather of the
    padded payload, ``(P - 1) x`` its bytes)."""
    if not ctx.is_distributed:
        return [t]
    sizes = ctx.all_gather(torch.tensor([t.shape[0]], dtype=torch.int64))[:, 0].tolist()
    width = max(sizes)
    padded = t.new_zeros((width, *t.shape[1:]))
    padded[: t.shape[0]] = t
    hooks.sent(kind, -1, -1, (ctx.world_size - 1) * padded.numel() * padded.element_size())
    rows = ctx.all_gather(padded)
    return [rows[r, :n] for r, n in enumerate(sizes)]


def owner_map(ctx: DistContext, hooks: Hooks, part: LocalPartition) -> tuple[Tensor, Tensor]:
    """``(owner [N] int32, row [N])``: every node's owner rank and its row there (int32 where
    rows fit, else int64): 8 bytes a node on every rank where two int64 maps took 16 (0.8 GB
    a rank saved at 100M nodes; torch indexes with int32, not int16). What goes on the wire
    is cast to int64 by the callers, so the bytes counted do not change."""
    N = part.num_nodes_global
    owner = torch.full((N,), -1, dtype=torch.int32)
    row = torch.full((N,), -1, dtype=torch.int32 if N < 2**31 else torch.int64)
    mine = part.global_ids.cpu()
    if N < 2**31:  # 4-byte ids on the wire and in the gathered block (0.4 GB less a rank at 100M nodes)
        mine = mine.to(torch.int32)
    for r, ids in enumerate(gather_variable(ctx, hooks, mine, "topology")):
        owner[ids] = r
        row[ids] = torch.arange(ids.numel(), dtype=row.dtype)
    return owner, row


def own_sources(part: LocalPartition) -> Tensor:
    """``[E_r]`` int64 global ids of the sources of this rank's in-edges (edge_index order)."""
    return torch.cat([part.global_ids, part.halo_global_ids]).cpu()[part.edge_index[0].cpu()]


def own_in_edges(part: LocalPartition) -> Tensor:
    """``[2, E_r]`` this rank's in-edges in global ids (source row 0, target row 1)."""
    src_ids = torch.cat([part.global_ids, part.halo_global_ids]).cpu()
    src, dst = part.edge_index.cpu()
    return torch.stack([src_ids[src], part.global_ids.cpu()[dst]])


def replicated_topology(ctx: DistContext, hooks: Hooks, part: LocalPartition) -> CSRTopology:
    """The whole graph's in-neighbour CSR on every rank, from the ranks' own in-edges."""
    edges = gather_variable(ctx, hooks, own_in_edges(part).t().contiguous(), "topology")
    src = torch.cat([e[:, 0] for e in edges])
    dst = torch.cat([e[:, 1] for e in edges])
    del edges  # the gathered block goes before the sort's key is made (TOPOLOGY_BUILD_BYTES_PER_EDGE)
    return CSRTopology.from_pairs(src, dst, part.num_nodes_global)


def remote_in_edges(ctx: DistContext, hooks: Hooks, own_csr: CSRTopology, owner: Tensor,
                    row: Tensor) -> RemoteInEdges:
    """Every node's whole in-edge list from its owner (VR-GCN and GraphSAINT on a partitioned
    topology): the owners' in-degrees and list offsets (by row) all-gathered once, ``[N]``
    each, and the ranks' edge counts (global edge ids number the edges owner by owner)."""
    columns = []
    for mine in (own_csr.in_degree(), own_csr.indptr[:-1].contiguous()):  # one at a time: less memory
        lists = gather_variable(ctx, hooks, mine, "topology")
        sizes = torch.tensor([int(t.numel()) for t in lists], dtype=torch.int64)
        base = torch.cumsum(sizes, 0) - sizes
        columns.append(torch.cat(lists)[base[owner] + row])  # node v: row[v] of its owner's list
        del lists
    deg, start = columns
    edges = torch.zeros(ctx.world_size, dtype=torch.int64).index_add_(0, owner, deg)  # each rank's edge count
    return RemoteInEdges(ctx, hooks, own_csr=own_csr, owner=owner, deg=deg, start=start,
                         edge_base=torch.cumsum(edges, 0) - edges)


def available_memory(ctx: DistContext) -> float:
    """Bytes of memory available on the tightest rank's host: every rank then takes the same
    memory-based decisions (or raises the same error), so none is left in a collective the
    others skip."""
    return float(ctx.all_reduce(torch.tensor([available_bytes()], dtype=torch.float64),
                                "min")[0])


TOPOLOGY_BUILD_BYTES_PER_EDGE = 32.0
"""A replicated topology's build, per edge of the whole graph on every rank: the all-gathered
``[E, 2]`` int64 in-edges beside their sources and targets taken apart (32 bytes), then
those beside the sort's int64 key (24), before the CSR keeps its int32 sources (4)."""


def choose_topology(cfg: SamplerConfig, num_nodes: int, num_edges: int, local_ranks: int,
                    available: float | None = None) -> str:
    """``replicated`` or ``partitioned`` for ``topology = auto`` (the same answer on every rank
    given the same numbers: the global edge count and :func:`available_memory`; ``None``
    reads this host's). Replicated when every local rank's CSR *build*
    (:data:`TOPOLOGY_BUILD_BYTES_PER_EDGE`, and GraphSAINT's normalisation) fits in the
    share: the build, not the 4 bytes an edge the CSR keeps, is what runs out of memory (four
    ranks building the 200M-edge CSR at once were OOM-killed under 20 GB)."""
    if cfg.topology != "auto":
        return cfg.topology
    per_edge = TOPOLOGY_BUILD_BYTES_PER_EDGE + (SAINT_BYTES_PER_EDGE if cfg.sampler.startswith("saint") else 0)
    need = (num_nodes * 8 + num_edges * per_edge) * local_ranks
    avail = available_bytes() if available is None else available
    share = cfg.topology_share * avail
    if need <= share:
        return "replicated"
    return "partitioned"


def keeps_half_features(cfg: SamplerConfig, fetch: FetchConfig) -> bool:
    """Whether a mini-batch rank keeps half-precision features as stored (a step converts the
    rows it reads, fetched rows travel at 2 bytes a value): not for VR-GCN, whose table
    carries float32 aggregates, nor for quantised or sparse fetches, whose codecs encode
    float32 rows."""
    return cfg.sampler != "vrgcn" and fetch.bits == 32 and not fetch.sparse


INFERENCE_SHARE = 0.5
"""``minibatch.inference = auto``: the largest fraction of available memory the full-graph
forward of all local ranks may take before inference runs layer by layer."""


def full_forward_bytes(*, own: int, rows: int, edges: int, width: int, num_features: int,
                       dtype_bytes: int = 4) -> float:
    """One rank's full-graph eval-mode forward beyond its partition: a layer's input on the
    owned and halo rows (``rows``) beside the halo block received (``rows - own``), both at
    ``max(F, W)`` wide, the layer's output on the owned rows, and the CSR operator pair over
    its edges (24 bytes an edge)."""
    return ((2 * rows - own) * max(width, num_features) + own * width) * dtype_bytes + 24 * edges


def choose_inference(cfg: SamplerConfig, *, own: int, rows: int, edges: int, width: int, num_features: int,
                     local_ranks: int, available: float, dtype_bytes: int = 4) -> str:
    """``full`` or ``layerwise`` for ``minibatch.inference = auto`` (the same answer on every
    rank given the same numbers: the largest rank's owned rows, rows with its halo and edges,
    and :func:`available_memory`)."""
    if cfg.inference != "auto":
        return cfg.inference
    need = full_forward_bytes(own=own, rows=rows, edges=edges, width=width, num_features=num_features,
                              dtype_bytes=dtype_bytes) * local_ranks
    return "full" if need <= INFERENCE_SHARE * available else "layerwise"


def inference_mode(ctx: DistContext, cfg: SamplerConfig, part: LocalPartition, model_cfg: ModelConfig,
                   dtype_bytes: int, available: float) -> str:
    """:func:`choose_inference` for this job: the largest rank's rows and edges (one
    all-reduce, so every rank decides alike) and ``available`` (:func:`available_memory`)."""
    largest = ctx.all_reduce(torch.tensor([float(part.num_owned), float(part.num_owned + part.num_halo),
                                           float(part.num_edges)], dtype=torch.float64), "max")
    width = max(d for _, d in layer_dims(model_cfg, int(part.x.shape[1]), part.num_classes))
    return choose_inference(cfg, own=int(largest[0]), rows=int(largest[1]), edges=int(largest[2]), width=width,
                            num_features=int(part.x.shape[1]), local_ranks=ctx.local_world_size,
                            available=available, dtype_bytes=dtype_bytes)


def build_sampler(cfg: SamplerConfig, ctx: DistContext, hooks: Hooks, part: LocalPartition, *, layers: int,
                  csr: CSRTopology | None, owner: Tensor, row: Tensor, seed: int) -> Sampler:
    """The sampler ``cfg.sampler`` over this rank's training nodes."""
    own = part.global_ids.cpu()
    train = part.train_mask.cpu()
    seeds = own[train]
    name = cfg.sampler
    own_csr = source = None
    used = cfg.fanout[: layers - 1] if name == "vrgcn" else cfg.fanout  # VR-GCN samples no input layer
    if csr is None and name in ("neighbor", "vrgcn") and -1 in used:
        raise ConfigError(f"minibatch.fanout = {','.join(map(str, cfg.fanout))}: a partitioned topology (the "
                          f"whole CSR does not fit in minibatch.topology_share of memory, or topology = "
                          f"'partitioned') needs a positive fan-out per sampled layer, not -1 (all): give one, "
                          f"or raise topology_share / set topology = 'replicated' if the CSR fits")
    if csr is None and name != "cluster":  # the owners answer for their nodes
        indptr, local_src = part.in_csr()
        ids = torch.cat([part.global_ids, part.halo_global_ids]).cpu()
        own_csr = CSRTopology.from_local_csr(indptr, local_src, ids.to(torch.int32) if
                                             part.num_nodes_global < 2**31 else ids)
        del ids
        gen = torch.Generator().manual_seed(stream_seed(seed, ctx.rank, "owner"))
        # (a walk's step is one draw: with replacement it costs a draw a node, not a shuffle)
        source = RemoteNeighbors(ctx, hooks, own_csr=own_csr, owner=owner, row=row,
                                 replace=cfg.replace or name.startswith("saint"), generator=gen)
    if name in ("neighbor", "vrgcn"):
        if len(cfg.fanout) != layers:
            raise ConfigError(f"minibatch.fanout has {len(cfg.fanout)} entries but the model has {layers} layers")
        if csr is not None:
            source = replicated_source(csr, cfg.replace)
        if name == "vrgcn":
            edges = csr if csr is not None else remote_in_edges(ctx, hooks, own_csr, owner, row)
            return VRGCNSampler(edges, source, seeds, cfg.fanout, cfg.batch_size)
        return NeighborSampler(source, seeds, cfg.fanout, cfg.batch_size)
    if name == "cluster":
        c = cfg.cluster
        if csr is None:  # its batches hold own nodes only, so own in-edges are all it reads
            csr = CSRTopology.from_edge_index(own_in_edges(part), part.num_nodes_global)
        return ClusterSampler(csr, own, train, num_layers=layers, num_clusters=c.num_clusters,
                              clusters_per_batch=c.clusters_per_batch, seed=seed)
    s = cfg.saint
    topology: CSRTopology | PartitionedEdges = csr if csr is not None else \
        PartitionedEdges(remote_in_edges(ctx, hooks, own_csr, owner, row), source)
    return SaintSampler(topology, own, train, kind=name.removeprefix("saint-"), num_layers=layers,  # type: ignore[arg-type]
                        budget=s.budget, walk_length=s.walk_length, presample=s.presample, steps=s.steps,
                        seed=stream_seed(seed, ctx.rank, "presample"))


def sampler_reach(cfg: SamplerConfig, layers: int) -> tuple[str, int]:
    """Where a sampler's remote rows can come from: ``(frontier, hops)``, the hops around
    this rank's ``"train"`` nodes, all its ``"own"`` nodes, or ``"train-or-own"`` (the
    training nodes, or every own node when none trains) that its batches can reach.
    Neighbour sampling reaches ``layers`` hops from its seeds (the training nodes); VR-GCN
    ``layers - 1`` (its input layer's aggregate is fetched precomputed); GraphSAINT's node
    and edge samplers one hop around every own node (their pool), its walks
    ``walk_length`` hops from their roots; Cluster-GCN none."""
    if cfg.sampler == "cluster":
        return "train", 0
    if cfg.sampler in ("saint-node", "saint-edge"):
        return "own", 1
    if cfg.sampler == "saint-rw":
        return "train-or-own", cfg.saint.walk_length
    return "train", layers - 1 if cfg.sampler == "vrgcn" else layers


def remote_candidates(part: LocalPartition, csr: CSRTopology | None, owner: Tensor, hops: int, *,
                      frontier: str = "train") -> Tensor:
    """Sorted global ids of the other ranks' nodes within ``hops`` of ``frontier`` (see
    :func:`sampler_reach`; its halo nodes when the topology is partitioned)."""
    if hops == 0:  # Cluster-GCN: a batch holds own nodes only
        return torch.empty(0, dtype=torch.int64)
    if csr is None:
        return torch.sort(part.halo_global_ids.cpu()).values
    reached = torch.zeros(csr.num_nodes, dtype=torch.bool)
    own = part.global_ids.cpu()
    train = part.train_mask.cpu()
    from_own = frontier == "own" or (frontier == "train-or-own" and not bool(train.any()))
    front = own if from_own else own[train]
    reached[front] = True
    for _ in range(hops):
        src, _ = csr.neighbours_of(front)
        src = torch.unique(src)
        front = src[~reached[src]]
        reached[front] = True
    return (reached & (owner != part.rank)).nonzero().flatten()


def cache_capacity(cfg: FetchConfig, num_candidates: int, width: int, element_size: int,
                   local_ranks: int = 1, available: float | None = None) -> int:
    """Rows of the cache; caches that together (one per rank on this host) do not fit in
    ``available`` memory (:func:`available_memory`; ``None`` reads this host's) are refused."""
    if cfg.cache_mb:
        avail = available_bytes() if available is None else available
        if cfg.cache_mb * 1e6 * local_ranks > avail:
            each = f" per rank x {local_ranks} ranks on this host" if local_ranks > 1 else ""
            raise ConfigError(f"fetch.cache_mb = {cfg.cache_mb:g} MB{each} exceeds the available memory "
                              f"({avail / 1e6:.0f} MB)")
        return capacity_rows(cfg.cache_mb, width, element_size)
    return int(round(cfg.cache_ratio * num_candidates))


def build_cache(cfg: FetchConfig, *, capacity: int, candidates: Tensor, degree: Tensor, hotness: Tensor | None,
                num_nodes: int, width: int, dtype: torch.dtype) -> RowCache:
    """The cache of ``cfg.cache_policy`` (a static one still to be filled by the caller)."""
    if cfg.cache_policy == "lru":
        return LRUCache(num_nodes, capacity, width, dtype)
    if cfg.cache_policy == "degree":
        ids = degree_ranking(candidates, degree, capacity)
    else:
        assert hotness is not None
        ids = hotness_ranking(hotness, capacity)
    return StaticCache(num_nodes, torch.sort(ids).values, width, dtype)
