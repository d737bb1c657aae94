"""Pre-flight checks: refuse a job that cannot run before any rank starts.

Three checks, each a one-line :class:`~commgnn.errors.UserError` that gives the numbers:

* **Rank count** (before the graph is even loaded): local ranks are capped at
  :data:`MAX_RANKS_PER_CORE` x the cores, unless ``runtime.force``. Beyond that each rank
  gets a sliver of a core, start-up alone takes minutes, and the job only thrashes.
* **Memory** (after partitioning, before the ranks start): :func:`estimate_memory` adds up
  the launcher (interpreter, graph, METIS and the partitions it builds) and, per rank, the
  interpreter with torch and PyG, the partition, and the activations and communication
  buffers (per model: :data:`ACTIVATION_COPIES`). A job whose estimate exceeds the
  machine's available memory (or ``runtime.memory_limit_gb``) is refused.
* **Disk** (before the run directory is written): partitions, metrics and checkpoints.

Mini-batch runs (``train.mode = "minibatch"``) have their own model,
:func:`estimate_minibatch_memory`: a rank's activations scale with the nodes one step
samples, not with its partition, but it may hold the whole graph's adjacency (a replicated
topology), a cache of remote rows, and a few arrays over every node of the graph. For
neighbour sampling and VR-GCN runs that this refuses, the launcher estimates again with the
step's size from a sampled probe of the graph (:mod:`commgnn.runner.step_probe`), capped by
the overlap-free bound.

The estimate is an upper-bound model, not a measurement; ``benchmarks/results`` compares it
with the peak RSS that runs record (``peak_rss_mb_sum``).
"""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import psutil

from commgnn.errors import UserError
from commgnn.runner.step_probe import PROBE_MARGIN, ProbeGraph, probe_hops
from commgnn.sampling.config import SamplerConfig
from commgnn.trainers.layerwise import DEFAULT_CHUNK_ROWS, layerwise_bytes
from commgnn.trainers.mb_setup import (TOPOLOGY_BUILD_BYTES_PER_EDGE, cache_capacity, choose_inference,
                                       choose_topology, full_forward_bytes, keeps_half_features)
from commgnn.distributed.memory import available_bytes

MAX_RANKS_PER_CORE = 8
"""Local ranks allowed per core without ``runtime.force`` (the benchmarks run 8 ranks on 2)."""
PROCESS_BASE_MB = 650.0
"""Resident memory of one rank before its activations: Python, torch, PyG, numba and gloo
(320 MB after import, about 380 MB once a process group is up) plus the operators and
buffers built once (CSR pairs, caches) and the allocator's slack, which dominate small
partitions. Ranks
forked from the fork server share its imported pages copy-on-write, so counting them in
every rank also covers the server itself."""
ACTIVATION_COPIES = {"gcn": 1.4, "sage": 1.6, "gat": 1.6}
"""Per model, ``[rows, width]`` tensors per layer that a rank holds at its peak, where
``rows`` counts its owned and halo rows (what a layer saves for the backward pass, the
received blocks and the concatenated input; a GCN that aggregates first keeps most of it
at ``n_own`` rows). Fitted as an upper bound on the peak RSS of full-graph runs (the fit
and its range are on the docs' results pages)."""
GAT_EDGE_COPIES = 6.0
"""GAT's per-edge tensors per layer and head (logits, LeakyReLU, softmax, their saved
inputs): ``GAT_EDGE_COPIES x layers x (edges + self loops) x heads`` values. Fitted on the
fused numba kernel, which never forms a row per edge."""
RES_PLUS_COPIES = 3.5
"""A DeepGCN res+ block without checkpointing keeps about ``3.25 n_own d`` values for the
backward pass (LayerNorm's input, the activation's output, dropout's mask, the
convolution's operand: :meth:`commgnn.models.deep.ResPlusGNN.saved_bytes_per_block`),
counted here on ``rows`` per layer. With checkpointing a block keeps ``rows d`` (its input
and received rows) and one block's worth more while it is recomputed."""
EDGE_ROW_COPIES = 2.0
"""Where a layer gathers a source row per edge (``x[src]`` and its weighted copy, ``[E, d]``):
GAT on the torch kernel or with attention dropout (kept per layer for the backward pass),
and a user's own PyG ``MessagePassing`` layers (counted for one layer: the gathered rows of
most layers are freed once aggregated)."""


BLOCK_EDGE_BYTES = 64.0
"""Mini-batch: bytes per sampled edge of a layer's block: its int64 ``[2, e]`` edges and
float64 weights, the CSR and transposed CSR the SpMM runs on, and the sampler's sort (a
subgraph sampler's in-edges gathered before they are filtered to the induced ones)."""
BATCH_FEATURE_COPIES = 3.0
"""Mini-batch: ``[S, F]`` rows per step, for ``S`` sampled nodes: the batch's gathered input,
the remote rows received (and the codec's buffers) and the rows sent to other ranks."""
TRACE_BYTES = 24.0
"""Mini-batch: bytes per requested remote row over an epoch: the fetcher's request trace
(int64 ids) and the offline-optimal cache's copies of it (``cat``, ``unique``)."""
TOPOLOGY_BYTES_PER_EDGE = TOPOLOGY_BUILD_BYTES_PER_EDGE
"""Mini-batch, replicated topology: every rank gathers the whole edge list and sorts it into
a CSR (:data:`~commgnn.trainers.mb_setup.TOPOLOGY_BUILD_BYTES_PER_EDGE`)."""
SAINT_EDGE_BYTES = 36.0
"""GraphSAINT: per edge of the whole graph, the pre-sampled edge weights (float64) and counts
(int32) it keeps, and the float64 transients that compute them."""
GLOBAL_NODE_BYTES = 12.0
"""Mini-batch: arrays over every node of the graph on each rank: the int32 owner and row
maps, and the int32 ids gathered to build them."""
CACHE_NODE_BYTES = 36.0
"""Mini-batch with a cache: more arrays over every node (the cache's slot map, degrees,
request counts, the reach mask)."""
OWN_CSR_BUILD_EDGE_BYTES = 32.0
"""Partitioned neighbour sampling: the own CSR's build besides 5 bytes a local row (the
int32 id table and a bool mask), per edge of one chunk (at most 4M edges: keys, rows and
gathers)."""
METIS_CLUSTER_SLACK = 1.05
"""Cluster-GCN: METIS's clusters exceed ``n / k`` nodes by up to its imbalance (3% by default)."""


@dataclass(frozen=True)
class StepSize:
    """Upper bounds on one mini-batch step on one rank (:func:`sampled_per_step`)."""

    nodes: int
    """Input rows: every node the step's layers read."""
    outs: tuple[int, ...]
    """``[L]``: output rows of each layer, input layer first."""
    edges: int
    """Sampled edges, summed over the layers' blocks."""
    full_edges: int = 0
    """VR-GCN: the full in-edges of the sampled blocks' destinations, summed over layers."""
    full_edges_layer: int = 0
    """VR-GCN: the largest of those per layer (its control variate gathers a row per edge)."""


def check_rank_count(parts: int, *, force: bool, cores: int | None = None) -> None:
    """Refuse more local ranks than :data:`MAX_RANKS_PER_CORE` x cores, unless forced."""
    cores = cores or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    cap = MAX_RANKS_PER_CORE * cores
    if parts > cap and not force:
        raise UserError(f"{parts} local ranks on {cores} cores is more than {cap} ({MAX_RANKS_PER_CORE} per "
                        f"core); use fewer --parts, run across machines with torchrun, or set "
                        f"runtime.force = true")


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes the job is expected to hold at its peak, by component."""

    launcher: float
    """The launcher: its interpreter, the graph (features, edges, labels, masks), METIS's
    CSR and the partitions it builds and saves before the ranks start."""
    per_rank: tuple[float, ...]
    """``[P]``: each rank's interpreter, partition, activations and communication buffers."""
    launcher_resident: float = 400 * 2**20
    """What the launcher keeps while the ranks run: it frees the graph and the partitions
    before it starts them, so this covers its interpreter and what it still holds."""

    @property
    def total(self) -> float:
        """The larger of the launcher's own peak (before any rank starts) and what the launcher
        and all ranks hold together afterwards."""
        return max(self.launcher, self.launcher_resident + sum(self.per_rank))

    def describe(self) -> str:
        gb = 1e9
        return (f"{self.total / gb:.1f} GB (launcher {self.launcher / gb:.1f} GB at its peak, then "
                f"{self.launcher_resident / gb:.1f} GB + {len(self.per_rank)} ranks x up to "
                f"{max(self.per_rank) / gb:.2f} GB)")


def estimate_memory(*, num_nodes: int, num_edges: int, num_features: int, num_classes: int,
                    report: dict[str, Any], layers: int, hidden: int, model: str = "gcn", heads: int = 1,
                    residual: str = "none", checkpoint: bool = False, edge_rows: bool = False,
                    dtype_bytes: int = 4, partitions_built: bool = True,
                    streamed: bool = False) -> MemoryEstimate:
    """The memory model of the module docstring, from the partition report's per-rank counts.

    Per rank ``r``: rows ``n_r = nodes[r] + halo_in[r]``; partition ``n_r F b + 32 e_r + 16 n_r``
    (features, int64 edges in both directions, ids); activations
    ``ACTIVATION_COPIES[model] L n_r H b`` (``model = "own"``, a user's module: the largest
    copies), or :data:`RES_PLUS_COPIES` for ``residual = "res+"``; GAT adds
    ``GAT_EDGE_COPIES L (e_r + nodes[r]) heads b``; ``edge_rows`` adds
    :data:`EDGE_ROW_COPIES` ``(e_r + nodes[r]) H b`` per layer for GAT, once for own modules.
    ``partitions_built = False``: the launcher loads a saved partition directory and runs
    neither METIS nor the partition builder. ``streamed``: the graph is a graph folder, which
    the launcher streams and never loads (:mod:`commgnn.runner.folder_graph`).
    """
    b = dtype_bytes
    P = len(report["nodes"])
    copies = ACTIVATION_COPIES.get(model, max(ACTIVATION_COPIES.values()))
    width = max(hidden, num_classes)
    per_rank = []
    for r in range(P):
        rows = report["nodes"][r] + report["halo_in"][r]
        edges = report["edges"][r] + report["nodes"][r]  # with self loops
        row = rows * width * b
        part = _partition_bytes(rows, report["edges"][r], num_features, b)
        if residual == "res+":
            act = (layers * row + RES_PLUS_COPIES * row) if checkpoint else RES_PLUS_COPIES * layers * row
        else:
            act = copies * layers * row
        if model == "gat":
            act += GAT_EDGE_COPIES * layers * edges * heads * b
        if edge_rows:
            act += EDGE_ROW_COPIES * (layers if model == "gat" else 1) * edges * width * b
        per_rank.append(PROCESS_BASE_MB * 2**20 + part + act)
    launcher = _launcher_bytes(num_nodes, num_edges, num_features, report, b, partitions_built, streamed)
    return MemoryEstimate(launcher=float(launcher), per_rank=tuple(float(x) for x in per_rank))


def _launcher_bytes(num_nodes: int, num_edges: int, num_features: int, report: dict[str, Any], b: int,
                    partitions_built: bool, streamed: bool = False) -> float:
    """The launcher's peak: interpreter, the graph, METIS's CSR and the partitions it builds
    (with their halo rows) before the ranks start; neither of the last two when it loads a
    saved partition directory. A ``streamed`` graph folder is never loaded: the launcher
    holds one chunk, plus, when it partitions, the out-of-core partitioner's per-node
    arrays and the on-disk CSR's pages it touches (``partition_memory_gb("lp-metis")``)."""
    if streamed:
        return PROCESS_BASE_MB * 2**20 + ((32 * num_edges + 40 * num_nodes) if partitions_built else 0)
    graph = num_nodes * (num_features * b + 8 + 3) + num_edges * 16
    if not partitions_built:
        return PROCESS_BASE_MB * 2**20 + graph
    metis = (num_nodes + 2 * num_edges) * 8
    parts_built = (num_nodes + sum(report["halo_in"])) * num_features * b + 2 * num_edges * 16
    return PROCESS_BASE_MB * 2**20 + graph + metis + parts_built


def _partition_bytes(rows: int, edges: int, num_features: int, b: int) -> float:
    """A rank's partition: features of its own and halo rows, int64 edges in both directions, ids."""
    return rows * num_features * b + edges * 16 * 2 + rows * 16


def sampled_per_step(*, sampler: str, batch_size: int, fanout: tuple[int, ...], layers: int, num_nodes: int,
                     num_edges: int, own_nodes: int, num_clusters: int = 40, clusters_per_batch: int = 4,
                     budget: int = 2000, walk_length: int = 2, replace: bool = False,
                     hops: Sequence[int] | None = None) -> StepSize:
    """Upper bounds on one step's batch on a rank with ``own_nodes`` (``d = 2 E / N``, twice
    the average degree, stands in where a degree is needed).

    neighbor: every node gathered so far draws ``f_k`` in-edges at hop ``k``, so
    ``c_0 = B`` and ``c_k = min(N, c_{k-1} (1 + f_k))`` nodes lie within ``k`` hops (a
    fan-out of -1 counts as ``d``); hop ``k``'s block has ``c_{k-1} f_k`` edges; layer
    ``j`` reads ``c_{L-j+1}`` rows and writes ``c_{L-j}``. vrgcn: the same with
    ``fanout[:L-1]``, plus the full in-edges of each sampled block's ``c_{k-1}``
    destinations, ``d`` each. (A hop draws its ``f_k`` per node directly, with or without
    replacement: nothing proportional to a node's degree is gathered.) Subgraph samplers run every layer on one subgraph of ``S``
    nodes and at most ``S d`` edges: cluster takes ``clusters_per_batch`` METIS clusters of
    at most ``METIS_CLUSTER_SLACK n / k`` nodes, GraphSAINT its budget (node), twice it
    (edge) or ``budget (walk_length + 1)`` (random walks).

    ``hops``: the node counts ``c_1 .. c_K`` a sampled probe measured on the graph
    (:func:`~commgnn.runner.step_probe.probe_hops`); each ``c_k`` is then
    ``min(PROBE_MARGIN probed_k, the bound above)``."""
    d = 2.0 * num_edges / max(num_nodes, 1)
    if sampler in ("neighbor", "vrgcn"):
        used = fanout[: layers - 1] if sampler == "vrgcn" else fanout
        fs = [d if f == -1 else float(f) for f in used]
        c = [float(min(batch_size, num_nodes))]
        for k, f in enumerate(fs):
            bound = min(float(num_nodes), c[-1] * (1 + f))
            c.append(min(bound, PROBE_MARGIN * hops[k]) if hops is not None else bound)
        edges = [c[k] * fs[k] for k in range(len(fs))]
        K = len(fs)
        outs = [int(c[K - j]) for j in range(1, K + 1)]
        in_edges = [min(c[k] * d, float(num_edges)) for k in range(K)]  # all in-edges of a hop's nodes
        if sampler == "vrgcn":  # its identity layer 0 writes every sampled row
            return StepSize(nodes=int(c[K]), outs=(int(c[K]), *outs), edges=int(sum(edges)),
                            full_edges=int(sum(in_edges)), full_edges_layer=int(max(in_edges, default=0)))
        return StepSize(nodes=int(c[K]), outs=tuple(outs), edges=int(sum(edges)))
    if sampler == "cluster":
        k = max(min(num_clusters, own_nodes), 1)
        nodes = clusters_per_batch * math.ceil(METIS_CLUSTER_SLACK * own_nodes / k)
    else:
        nodes = {"saint-node": budget, "saint-edge": 2 * budget}.get(sampler, budget * (walk_length + 1))
    S = int(min(float(nodes), float(num_nodes)))
    return StepSize(nodes=S, outs=(S,) * layers, edges=int(min(S * d, num_edges)))


def estimate_minibatch_memory(*, num_nodes: int, num_edges: int, num_features: int, num_classes: int,
                              report: dict[str, Any], layers: int, hidden: int, sampler: str = "neighbor",
                              batch_size: int = 1024, fanout: tuple[int, ...] = (15, 10),
                              topology: str = "replicated", cache_mb: float = 0.0, cache_ratio: float = 0.0,
                              prefetch: bool = False, num_clusters: int = 40, clusters_per_batch: int = 4,
                              budget: int = 2000, walk_length: int = 2, saint_steps: int = 0, presample: int = 50,
                              replace: bool = False, dtype_bytes: int = 4,
                              partitions_built: bool = True, streamed: bool = False,
                              probed_hops: Sequence[Sequence[int]] | None = None, inference: str = "auto",
                              inference_chunk: int = DEFAULT_CHUNK_ROWS,
                              available: float | None = None, feature_bytes: int | None = None,
                              folders: bool = False, features_in_place: bool = False) -> MemoryEstimate:
    """The mini-batch memory model (module docstring). Per rank ``r``, with the step's sizes
    from :func:`sampled_per_step` (``S`` input rows, ``o_j`` output rows of layer ``j``,
    ``e`` block edges), ``W = max(H, C)`` and ``F' = 2F`` for VR-GCN (its rows carry their
    exact input aggregate), else ``F``:

    * the partition: the owned rows' features (a mini-batch rank fetches the others) at
      ``feature_bytes`` a value (half-precision features stay as stored; ``b`` when None),
      its int64 edges and ids: ``own_r F fb + 16 e_r + 16 n_r``; rank folders read in place
      (``folders``) hold none of it but the features (none either when read as stored),
      and an exact evaluation expands their edges (``16 e_r``);
    * topology: replicated ``TOPOLOGY_BYTES_PER_EDGE E + 8 N``; partitioned, neighbour
      sampling keeps ``4 e_r + 8 own_r`` (int32 sources, row pointers) and builds it
      through ``5 n_r`` and :data:`OWN_CSR_BUILD_EDGE_BYTES` a chunk's edge (a phase of its own, below); the other samplers ``16 e_r``
      plus, for VR-GCN and GraphSAINT, ``32 N`` (every node's in-degree and list offset at
      its owner, and their gathering; Cluster-GCN ``8 N``, its CSR's row pointer);
      GraphSAINT's pre-sampled normalisation: on a replicated topology it peaks after the
      CSR's build, so the edges cost ``max(TOPOLOGY_BYTES_PER_EDGE, 4 + SAINT_EDGE_BYTES) E``;
      partitioned, ``12 min(presample e, E)`` (the edges
      met); saint-edge ``24 e_r``
      (its draw table);
    * ``GLOBAL_NODE_BYTES N``, and ``CACHE_NODE_BYTES N`` more with a cache;
    * the cache (ranks > 1): ``cache_mb``, or ``cache_ratio`` of the other ranks' nodes,
      ``F' b + 16`` bytes per row;
    * with a cache, the request trace its comparisons read: ``TRACE_BYTES S`` per step of
      the epoch (the most training nodes of any rank over ``B`` for neighbour sampling; for
      subgraph samplers the most nodes of any rank over ``S``, or ``saint.steps``);
    * the largest of four phases: the set-up's topology build; sampling holds the blocks (``BLOCK_EDGE_BYTES e``); a
      training step holds the blocks,
      ``BATCH_FEATURE_COPIES S F' b`` and ``ACTIVATION_COPIES["sage"] W b`` per output row of
      every layer (with ``fetch.prefetch`` the next step is sampled and fetched meanwhile:
      both phases at once); the exact evaluation each epoch, as ``minibatch.inference``
      runs it (:func:`~commgnn.trainers.mb_setup.choose_inference` on the largest rank):
      the full-graph forward (:func:`~commgnn.trainers.mb_setup.full_forward_bytes`) or
      layer by layer (:func:`~commgnn.trainers.layerwise.layerwise_bytes`);
    * VR-GCN: the history, ``N H (L - 1) b``; the rank's ``[n_own, 2F]`` table; per step 24
      bytes per full in-edge and a ``[e_full, H]`` gather and its weighted copy for the
      largest layer's control variate.

    ``probed_hops`` (neighbour sampling and VR-GCN): per rank, the hop node counts a sampled
    probe measured (:mod:`commgnn.runner.step_probe`), in place of the overlap-free bound.
    ``folders``: the ranks read rank folders in place (a graph folder's partitions);
    ``features_in_place``: their feature rows are read as stored (no converted copy).
    ``inference`` / ``inference_chunk``: ``minibatch.inference`` and its chunk (``sampled``:
    evaluation is a sampled step's worth, inside the step's term);
    ``available``: the bytes ``auto`` decides against (this host's available memory when None).
    """
    b = dtype_bytes
    vr = sampler == "vrgcn"
    width = max(hidden, num_classes)
    row_f = (2 if vr else 1) * num_features * b
    P = len(report["nodes"])
    fb = b if feature_bytes is None else min(feature_bytes, b)
    train = report.get("train_nodes") or report["nodes"]
    largest_rows = max(n + h for n, h in zip(report["nodes"], report["halo_in"]))
    mode = choose_inference(SamplerConfig(inference=inference), own=max(report["nodes"]), rows=largest_rows,
                            edges=max(report["edges"]),
                            width=width, num_features=num_features, local_ranks=P,
                            available=available_bytes() if available is None else available, dtype_bytes=b)

    def eval_bytes(own: int, rows: int, edges: int) -> float:
        if mode == "full":
            return full_forward_bytes(own=own, rows=rows, edges=edges, width=width, num_features=num_features,
                                      dtype_bytes=b)
        return layerwise_bytes(own=own, chunk_rows=inference_chunk, edges=edges, num_nodes=num_nodes,
                               dims=[num_features] + [hidden] * (layers - 1) + [num_classes],
                               avg_degree=num_edges / max(num_nodes, 1), dtype_bytes=b, feature_bytes=fb)

    per_rank = []
    for r in range(P):
        own, rows, e_r = report["nodes"][r], report["nodes"][r] + report["halo_in"][r], report["edges"][r]
        # rank folders (a graph folder's partitions) stay memory maps: ids and the in-CSR are
        # file-backed, the features too where they are read as stored; edge_index is
        # expanded (16 bytes an edge) only by an exact evaluation
        part = (0 if folders and features_in_place else own * num_features * fb) + (0 if folders else 16 * e_r + 16 * rows)
        st = sampled_per_step(sampler=sampler, batch_size=batch_size, fanout=fanout, layers=layers,
                              num_nodes=num_nodes, num_edges=num_edges, own_nodes=own, num_clusters=num_clusters,
                              clusters_per_batch=clusters_per_batch, budget=budget, walk_length=walk_length,
                              replace=replace, hops=None if probed_hops is None else probed_hops[r])
        build = 0.0
        if topology == "replicated":
            # GraphSAINT pre-samples once the CSR is built: its normalisation's peak (on top of
            # the CSR's 4-byte indices) comes after the build's, not on top of it
            per_edge = max(TOPOLOGY_BYTES_PER_EDGE, 4 + SAINT_EDGE_BYTES) if sampler.startswith("saint") \
                else TOPOLOGY_BYTES_PER_EDGE
            topo = per_edge * num_edges + 8 * num_nodes
        else:  # the own in-edges; Cluster-GCN's CSR of them has a row pointer over every node,
            # VR-GCN and GraphSAINT every node's in-degree and list offset at its owner (16 N
            # kept, about as much again while they are gathered), and GraphSAINT the ids and
            # counts of the edges its pre-sampled subgraphs met
            if sampler == "neighbor":
                topo, build = 4 * e_r + 8 * own, 5 * rows + OWN_CSR_BUILD_EDGE_BYTES * min(e_r, 2**22)
            else:
                topo = 16 * e_r + (8 if sampler == "cluster" else 32) * num_nodes
            if sampler.startswith("saint"):
                topo += 12 * min(presample * st.edges, num_edges)
        if sampler == "saint-edge":  # its draw table: source, target and CDF of every own in-edge
            topo += 24 * e_r
        cache_rows = 0.0 if P == 1 else (cache_mb * 1e6 / row_f if cache_mb else cache_ratio * (num_nodes - own))
        if sampler in ("neighbor", "vrgcn"):
            steps = math.ceil(max(train) / batch_size)
        else:
            steps = saint_steps if sampler.startswith("saint") and saint_steps else \
                math.ceil(max(report["nodes"]) / max(st.nodes, 1))
        blocks = BLOCK_EDGE_BYTES * st.edges + 24 * st.full_edges
        sampling = blocks
        train_step = (blocks + BATCH_FEATURE_COPIES * st.nodes * row_f
                      + ACTIVATION_COPIES["sage"] * sum(st.outs) * width * b
                      + (2 * st.full_edges_layer * hidden * b if vr else 0))
        step = train_step + sampling + st.nodes * row_f if prefetch else max(train_step, sampling)
        extra = (num_nodes * hidden * (layers - 1) + own * 2 * num_features) * b if vr else 0
        trace = TRACE_BYTES * steps * st.nodes if cache_rows else 0.0
        evaluation = 0.0 if mode == "sampled" else eval_bytes(own, rows, e_r) + (16 * e_r if folders else 0)
        per_rank.append(PROCESS_BASE_MB * 2**20 + part + topo + GLOBAL_NODE_BYTES * num_nodes
                        + (CACHE_NODE_BYTES * num_nodes if cache_rows else 0.0) + cache_rows * (row_f + 16) + trace
                        + max(step, evaluation, build) + extra)
    launcher = _launcher_bytes(num_nodes, num_edges, num_features, report, b, partitions_built, streamed)
    return MemoryEstimate(launcher=float(launcher), per_rank=tuple(float(x) for x in per_rank))


def estimate_for_config(cfg: Any, graph: dict[str, Any], report: dict[str, Any], *,
                        own: bool = False, probe: ProbeGraph | None = None) -> MemoryEstimate | None:
    """:func:`estimate_memory` for a run's resolved ``RunConfig`` (``own``: a user's module
    replaces ``[model]``'s), or ``None`` for a partition report without per-rank counts (a
    partition directory from an older version). ``probe``: a
    :class:`~commgnn.runner.step_probe.ProbeGraph`, with which neighbour sampling and VR-GCN
    runs are estimated from sampled step sizes rather than the overlap-free bound."""
    needed = ("num_nodes", "num_edges", "num_features", "num_classes")
    if not all(k in report for k in ("nodes", "halo_in", "halo_out", "edges")) or not all(k in graph for k in needed):
        return None
    m = cfg.model
    if cfg.train.mode == "minibatch":
        return _minibatch_for_config(cfg, graph, report, probe)  # the built-in GraphSAGE (own models train full-graph)
    gat_rows = m.name == "gat" and (m.attn_dropout > 0 or cfg.train.resolved_kernel != "numba")
    return estimate_memory(num_nodes=int(graph["num_nodes"]), num_edges=int(graph["num_edges"]),
                           num_features=int(graph["num_features"]), num_classes=int(graph["num_classes"]),
                           report=report, layers=m.layers, hidden=m.hidden,
                           model="own" if own else m.name, heads=m.heads, residual=m.residual,
                           checkpoint=m.checkpoint, edge_rows=own or gat_rows,
                           dtype_bytes=8 if cfg.train.dtype == "float64" else 4,
                           partitions_built=not cfg.partition.dir, streamed=graph.get("format") == "graph folder")


def _minibatch_for_config(cfg: Any, graph: dict[str, Any], report: dict[str, Any],
                          probe: ProbeGraph | None) -> MemoryEstimate:
    """:func:`estimate_minibatch_memory` for a resolved ``RunConfig``, on the topology the
    ranks will choose and after the checks the ranks would fail (a cache over memory)."""
    mb, m = cfg.minibatch, cfg.model
    N, E, F = int(graph["num_nodes"]), int(graph["num_edges"]), int(graph["num_features"])
    b = 8 if cfg.train.dtype == "float64" else 4
    P = cfg.runtime.parts
    # The ranks read available memory once the launcher has freed the graph and partitions
    # it holds now, so what they will see is today's available plus that.
    freed = max(0.0, psutil.Process().memory_info().rss - MemoryEstimate.launcher_resident)
    available = available_bytes() + freed
    if P > 1:  # a cache_mb over memory gets the ranks' own message rather than a total
        cache_capacity(cfg.fetch, 0, (2 if mb.sampler == "vrgcn" else 1) * F, b, local_ranks=P, available=available)
    topology = choose_topology(mb, N, E, P, available)
    hops = None
    if probe is not None and mb.sampler in ("neighbor", "vrgcn"):
        used = mb.fanout[: m.layers - 1] if mb.sampler == "vrgcn" else mb.fanout
        hops = probe_hops(probe, fanout=used, batch_size=mb.batch_size, replace=mb.replace) if used else None
    return estimate_minibatch_memory(
        num_nodes=N, num_edges=E, num_features=F, num_classes=int(graph["num_classes"]), report=report,
        layers=m.layers, hidden=m.hidden, sampler=mb.sampler, batch_size=mb.batch_size, fanout=tuple(mb.fanout),
        topology=topology, cache_mb=cfg.fetch.cache_mb, cache_ratio=cfg.fetch.cache_ratio,
        prefetch=cfg.fetch.prefetch, num_clusters=mb.cluster.num_clusters,
        clusters_per_batch=mb.cluster.clusters_per_batch, budget=mb.saint.budget,
        walk_length=mb.saint.walk_length, saint_steps=mb.saint.steps, presample=mb.saint.presample,
        replace=mb.replace, dtype_bytes=b,
        partitions_built=not cfg.partition.dir, streamed=graph.get("format") == "graph folder", probed_hops=hops,
        inference=mb.inference, inference_chunk=mb.inference_chunk, available=available,
        feature_bytes=graph.get("feature_bytes") if keeps_half_features(mb, cfg.fetch) else None,
        folders=graph.get("format") == "graph folder",
        features_in_place=graph.get("feature_bytes") == b or (keeps_half_features(mb, cfg.fetch)
                                                             and graph.get("feature_bytes") is not None))


def check_memory(est: MemoryEstimate, *, limit_gb: float) -> None:
    """Refuse when the estimate exceeds ``limit_gb`` (0 = the machine's available memory)."""
    avail = limit_gb * 1e9 if limit_gb else available_bytes()
    if est.total > avail:
        where = f"runtime.memory_limit_gb = {limit_gb:g}" if limit_gb else \
            f"{avail / 1e9:.1f} GB available on this machine"
        raise UserError(f"the job needs an estimated {est.describe()}, more than {where}; use fewer "
                        f"ranks, a smaller model, or more machines (the estimate is an upper bound: "
                        f"--memory-limit-gb / runtime.memory_limit_gb raises the cap)")


def estimate_run_bytes(*, partition_bytes: float, epochs: int, param_count: int, parts: int,
                       checkpoint_every: int) -> float:
    """Disk a run writes: its partitions, about 4 kB of metrics per epoch, and two checkpoint
    sets (model, Adam's two moments, and as much again for communication state) per rank."""
    ckpt = 2 * parts * param_count * 4 * 4 if checkpoint_every else 0
    return partition_bytes + 4096 * epochs + ckpt + 1e6


def check_disk(out: Path, need: float) -> None:
    """Refuse when the file system of ``out`` has less than ``need`` bytes free."""
    probe = out
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if need > free:
        raise UserError(f"the run needs about {need / 1e6:.0f} MB in {out} but only {free / 1e6:.0f} MB "
                        f"are free there; choose another --out")
