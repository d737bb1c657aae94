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

The estimate is an upper-bound model, not a measurement; ``benchmarks/results`` compares it
with the peak RSS that runs record (``peak_rss_mb_sum``).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from commgnn.errors import UserError

MAX_RANKS_PER_CORE = 8
"""Local ranks allowed per core without ``runtime.force`` (the benchmarks run 8 ranks on 2)."""
PROCESS_BASE_MB = 650.0
"""Resident memory of one rank before its activations: Python, torch, PyG, numba and gloo
(320 MB after import, about 380 MB once a process group is up) plus the operators and
buffers built once (CSR pairs, caches) and the allocator's slack, which dominate small
partitions (650 rather than 600: a 100k-node rank of 3x128 SAGE peaked at 853 MB). Ranks
forked from the fork server share its imported pages copy-on-write, so counting them in
every rank also covers the server itself."""
ACTIVATION_COPIES = {"gcn": 1.4, "sage": 1.6, "gat": 1.6}
"""Per model, ``[rows, width]`` tensors per layer that a rank holds at its peak, where
``rows`` counts its owned and halo rows (what a layer saves for the backward pass, the
received blocks and the concatenated input; a GCN that aggregates first keeps most of it
at ``n_own`` rows). Fitted as an upper bound on the peak RSS of the full-graph scale runs
(``benchmarks/results/2026-12-03-preflight-fit.md``: 100k to 2M nodes, 4 ranks, exact and
levers): each rank's estimate is 1.03-1.26x its measured peak for GCN and SAGE (at 1M and
2M nodes the copies that fit exactly are 1.01-1.19 for GCN and 1.30-1.39 for SAGE); GAT,
measured at 100k and 300k only, 1.06-1.42x."""
GAT_EDGE_COPIES = 6.0
"""GAT's per-edge tensors per layer and head (logits, LeakyReLU, softmax, their saved
inputs): ``GAT_EDGE_COPIES x layers x (edges + self loops) x heads`` values. Fitted on the
fused numba kernel, which never forms a row per edge."""
RES_PLUS_COPIES = 3.5
"""A DeepGCN res+ block without checkpointing keeps about ``3.25 n_own d`` values for the
backward pass (LayerNorm's input, the activation's output, dropout's mask, the
convolution's operand: :meth:`commgnn.models.deep.ResPlusGNN.saved_bytes_per_block`),
counted here on ``rows`` per layer. With checkpointing a block keeps ``rows d`` (its input
and received rows) and one block's worth more while it is recomputed. Not measured at scale."""
EDGE_ROW_COPIES = 2.0
"""Where a layer gathers a source row per edge (``x[src]`` and its weighted copy, ``[E, d]``):
GAT on the torch kernel or with attention dropout (kept per layer for the backward pass),
and a user's own PyG ``MessagePassing`` layers (counted for one layer: the gathered rows of
most layers are freed once aggregated)."""


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
    before it starts them (measured: 270-290 MB resident beside 1M-node ranks)."""

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
                    dtype_bytes: int = 4, partitions_built: bool = True) -> MemoryEstimate:
    """The memory model of the module docstring, from the partition report's per-rank counts.

    Per rank ``r``: rows ``n_r = nodes[r] + halo_in[r]``; partition ``n_r F b + 32 e_r + 16 n_r``
    (features, int64 edges in both directions, ids); activations
    ``ACTIVATION_COPIES[model] L n_r H b`` (``model = "own"``, a user's module: the largest
    copies), or :data:`RES_PLUS_COPIES` for ``residual = "res+"``; GAT adds
    ``GAT_EDGE_COPIES L (e_r + nodes[r]) heads b``; ``edge_rows`` adds
    :data:`EDGE_ROW_COPIES` ``(e_r + nodes[r]) H b`` per layer for GAT, once for own modules.
    ``partitions_built = False``: the launcher loads a saved partition directory and runs
    neither METIS nor the partition builder.
    """
    b = dtype_bytes
    graph = num_nodes * (num_features * b + 8 + 3) + num_edges * 16
    metis = (num_nodes + 2 * num_edges) * 8
    P = len(report["nodes"])
    halo_rows = sum(report["halo_in"])
    parts_built = (num_nodes + halo_rows) * num_features * b + 2 * num_edges * 16
    if not partitions_built:
        metis = parts_built = 0
    copies = ACTIVATION_COPIES.get(model, max(ACTIVATION_COPIES.values()))
    width = max(hidden, num_classes)
    per_rank = []
    for r in range(P):
        rows = report["nodes"][r] + report["halo_in"][r]
        edges = report["edges"][r] + report["nodes"][r]  # with self loops
        row = rows * width * b
        part = rows * num_features * b + report["edges"][r] * 16 * 2 + rows * 16
        if residual == "res+":
            act = (layers * row + RES_PLUS_COPIES * row) if checkpoint else RES_PLUS_COPIES * layers * row
        else:
            act = copies * layers * row
        if model == "gat":
            act += GAT_EDGE_COPIES * layers * edges * heads * b
        if edge_rows:
            act += EDGE_ROW_COPIES * (layers if model == "gat" else 1) * edges * width * b
        per_rank.append(PROCESS_BASE_MB * 2**20 + part + act)
    launcher = PROCESS_BASE_MB * 2**20 + graph + metis + parts_built
    return MemoryEstimate(launcher=float(launcher), per_rank=tuple(float(x) for x in per_rank))


def estimate_for_config(cfg: Any, graph: dict[str, Any], report: dict[str, Any], *,
                        own: bool = False) -> MemoryEstimate | None:
    """:func:`estimate_memory` for a run's resolved ``RunConfig`` (``own``: a user's module
    replaces ``[model]``'s), or ``None`` for a partition report without per-rank counts (a
    partition directory from an older version)."""
    needed = ("num_nodes", "num_edges", "num_features", "num_classes")
    if not all(k in report for k in ("nodes", "halo_in", "halo_out", "edges")) or not all(k in graph for k in needed):
        return None
    m = cfg.model
    gat_rows = m.name == "gat" and (m.attn_dropout > 0 or cfg.train.resolved_kernel != "numba")
    return estimate_memory(num_nodes=int(graph["num_nodes"]), num_edges=int(graph["num_edges"]),
                           num_features=int(graph["num_features"]), num_classes=int(graph["num_classes"]),
                           report=report, layers=m.layers, hidden=m.hidden,
                           model="own" if own else m.name, heads=m.heads, residual=m.residual,
                           checkpoint=m.checkpoint, edge_rows=own or gat_rows,
                           dtype_bytes=8 if cfg.train.dtype == "float64" else 4,
                           partitions_built=not cfg.partition.dir)


def check_memory(est: MemoryEstimate, *, limit_gb: float) -> None:
    """Refuse when the estimate exceeds ``limit_gb`` (0 = the machine's available memory)."""
    avail = limit_gb * 1e9 if limit_gb else float(psutil.virtual_memory().available)
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
