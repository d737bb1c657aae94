"""``lp-metis``: multilevel partitioning with bounded memory: label propagation clusters,
METIS on the coarse graph, projection back and one boundary refinement pass.

1. **Clustering** (size-capped label propagation, Raghavan et al. 2007, with the size cap
   of Meyerhenke et al.'s "size-constrained label propagation", 2014). Every node starts
   in its own cluster; for a few rounds each node moves to the cluster holding the largest
   weight of its neighbours, if that cluster stays within ``cap`` vertex weight. Nodes are
   visited in id order, in node ranges of about :data:`EDGE_BUDGET` CSR entries; a range
   is vectorised (one ``np.unique`` of ``(node, label)`` keys gives every node's label
   counts) and sees the labels of the ranges before it. Ties go to the current label,
   then to the label with the largest hash of ``(label, seed)``; a range's movers into one
   cluster are admitted in id order until the cap is met.
2. **Coarse graph**: one vertex per cluster (weight = its size), edge weights = the number
   of CSR entries between two clusters, accumulated range by range with ``np.unique`` on
   int64 keys and merged; on a big graph from disk the ranges' pairs spill to scratch
   files by source cluster and each file is merged alone. At most
   :data:`COARSE_MAX_ENTRIES` pairs are kept: beyond, only pairs of weight at least the
   smallest threshold that meets it (a rule on the weight alone, so the coarse graph stays
   symmetric). What goes is the pairs joined by one or two stray edges: on a graph with
   edges "anywhere" (a quarter of the papers100M-shaped generator's) they are nearly all
   of the distinct pairs (450M of them there) and carry no preference between partitions,
   as a balanced k-way split cuts ``(k-1)/k`` of uniformly random edges whatever it does.
   Clusters without an outside edge are packed together up to the cap. While the coarse graph has more than :data:`COARSE_MAX_NODES` vertices and the last
   level shrank it by at least 10%, it is clustered again (multilevel).
3. **METIS** (pymetis, k-way, vertex and edge weights) partitions the coarsest graph; the
   parts are projected back through the levels.
4. **Refinement**: one pass over the nodes moves a node to the part holding the most of its
   neighbours when that strictly reduces the cut and keeps the part within ``(1 + eps)``
   times the mean size (the slack METIS's default ``ufactor`` allows).

Memory: the fine graph is read through the CSR arrays (memory maps for a graph folder),
range by range; besides them the method holds ``O(N)`` per-node arrays (labels, cluster
sizes, parts), one scratch file's pairs, and the coarse graph of at most
:data:`COARSE_MAX_ENTRIES` entries. Everything is a
deterministic function of the CSR's rows as multisets and ``seed``, so the in-memory
registration (CSR built from ``edge_index``) and the on-disk path give identical parts.
Written by hand because no maintained library offers a multilevel partitioner over a
memory-mapped graph (METIS and KaHIP need the whole graph in memory).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pymetis
import torch
from torch import Tensor

from commgnn.errors import PartitionError
from commgnn.partition.base import PARTITIONERS
from commgnn.partition.disk_csr import SymmetricCSR, array_edge_chunks, build_symmetric_csr, id_dtype, node_chunks

if TYPE_CHECKING:
    from commgnn.partition.config import PartitionConfig

CAP_FACTOR = 32
"""Cluster weight cap = total weight / (P * CAP_FACTOR): clusters small enough for METIS to
balance the parts to about 1/CAP_FACTOR of a part."""
ITERATIONS = 3
"""Label propagation rounds per level."""
COARSE_MAX_NODES = 200_000
"""Coarsen again while the coarse graph has more vertices than this."""
MAX_LEVELS = 4
"""At most this many clustering levels."""
EDGE_BUDGET = 1 << 21
"""CSR entries per vectorised node range (about 100 MB of temporaries)."""
COARSE_MAX_ENTRIES = 1 << 25
"""At most this many coarse-graph entries (about 33.5M) go on to the next level or METIS:
beyond, the lightest cluster pairs are dropped (module docstring, step 2)."""
SPILL_ENTRIES = 1 << 26
"""With a work directory, a fine graph of more CSR entries than this accumulates its
cluster pairs in scratch files, one per range of source clusters, of about this many
entries each."""
_HIST = 1 << 16
"""Weights are histogrammed up to this value to pick the threshold."""
EPS = 0.03
"""Refinement keeps every part within (1 + EPS) * N / P nodes (METIS's default k-way slack)."""

_MIX = np.uint64(0x9E3779B97F4A7C15)


def _hash(labels: np.ndarray, seed: int) -> np.ndarray:
    """A fixed pseudo-random uint64 per label (splitmix64 finaliser of label + seed)."""
    with np.errstate(over="ignore"):
        z = labels.astype(np.uint64) + np.uint64(seed % 2**64) * _MIX + _MIX
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _range(indptr: np.ndarray, indices: np.ndarray, s: int, e: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Local row ids (0-based in the range) and neighbour ids of nodes ``[s, e)``, and the offset."""
    ptr = np.asarray(indptr[s:e + 1])
    lo, hi = int(ptr[0]), int(ptr[-1])
    nbr = np.asarray(indices[lo:hi]).astype(np.int64)
    row = np.repeat(np.arange(e - s, dtype=np.int64), np.diff(ptr))
    return row, nbr, lo


def label_propagation(indptr: np.ndarray, indices: np.ndarray, *, cap: float, seed: int,
                      vweights: np.ndarray | None = None, eweights: np.ndarray | None = None,
                      iterations: int = ITERATIONS, edge_budget: int = EDGE_BUDGET) -> np.ndarray:
    """``[N]`` cluster labels, int32 where ids fit (node ids of cluster seeds; see the module docstring).

    ``vweights`` (default 1) are the nodes' weights, ``eweights`` (default 1) the CSR
    entries'; no cluster's weight exceeds ``max(cap, heaviest node)``."""
    N = len(indptr) - 1
    labels = np.arange(N, dtype=id_dtype(N))
    if vweights is None:  # unit weights without an [N] array of ones
        vw = np.broadcast_to(np.int64(1), (N,))
        size = np.ones(N, dtype=np.int64)
    else:
        vw = np.asarray(vweights, dtype=np.int64)
        size = vw.copy()
    ranges = node_chunks(indptr, edge_budget)
    for _ in range(iterations):
        moved = 0
        for s, e in ranges:
            row, nbr, lo = _range(indptr, indices, s, e)
            if len(nbr) == 0:
                continue
            key = row * N + labels[nbr]
            if eweights is None:
                ukey, cnt = np.unique(key, return_counts=True)
            else:
                ukey, inv = np.unique(key, return_inverse=True)
                cnt = np.bincount(inv, weights=np.asarray(eweights[lo:lo + len(nbr)]), minlength=len(ukey))
                cnt = np.rint(cnt).astype(np.int64)
            del key, row, nbr
            node, lab = ukey // N, ukey % N
            cur = labels[s + node]
            w = vw[s + node]
            stay = lab == cur
            allowed = stay | (size[lab] + w <= cap)
            score = np.where(allowed, 2 * cnt + stay, -1)
            # best entry per node: lexsort's last key is primary; the run's last entry wins
            order = np.lexsort((_hash(lab, seed), score, node))
            node, lab, score = node[order], lab[order], score[order]
            last = np.flatnonzero(np.append(node[1:] != node[:-1], True))
            bnode, blab, bscore = node[last], lab[last], score[last]
            move = (blab != labels[s + bnode]) & (bscore > 0)
            if not move.any():
                continue
            mv, dest = s + bnode[move], blab[move]
            mw = vw[mv]
            # admit a cluster's movers in id order while its weight stays within the cap
            o = np.lexsort((mv, dest))
            mv, dest, mw = mv[o], dest[o], mw[o]
            starts = np.flatnonzero(np.concatenate([[True], dest[1:] != dest[:-1]]))
            csum = np.cumsum(mw)
            before = np.repeat(csum[starts] - mw[starts], np.diff(np.append(starts, len(dest))))
            ok = size[dest] + (csum - before) <= cap
            mv, dest, mw = mv[ok], dest[ok], mw[ok]
            np.subtract.at(size, labels[mv], mw)
            np.add.at(size, dest, mw)
            labels[mv] = dest
            moved += len(mv)
        if moved == 0:
            break
    return labels


def _coarse_graph(indptr: np.ndarray, indices: np.ndarray, cluster: np.ndarray, C: int,
                  eweights: np.ndarray | None, edge_budget: int, *, cw: np.ndarray | None = None,
                  workdir: Path | None = None, max_entries: int = COARSE_MAX_ENTRIES,
                  spill_entries: int = SPILL_ENTRIES) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(xadj [C+1], adjncy, eweights)`` int64 of the cluster graph (no self loops).

    Pairs are accumulated range by range. With a ``workdir`` and more than
    ``spill_entries`` CSR entries, each range's distinct pairs spill to one of ``K``
    scratch files by source-cluster range (``cw`` balances the ranges), and each file is
    merged alone: memory ``O(nnz / K)``, not ``O(distinct pairs)``. When more than
    ``max_entries`` distinct pairs remain, only those of weight at least the smallest
    threshold that keeps ``max_entries`` are kept (module docstring, step 2)."""
    nnz = int(indptr[-1])
    K = 1 if workdir is None or nnz <= spill_entries else -(-nnz // spill_entries)
    # bucket k holds source clusters [cb[k], cb[k+1])
    if K == 1:
        cb = np.array([0, C], dtype=np.int64)
    else:
        cum = np.cumsum(cw if cw is not None else np.ones(C, dtype=np.int64))
        cb = np.concatenate([[0], np.searchsorted(cum, cum[-1] * np.arange(1, K) / K, side="right"), [C]])
    kb = cb * C  # key bounds
    wdt = np.float32 if eweights is None else np.float64  # per-range counts <= edge_budget: exact in float32
    mem_keys: list[np.ndarray] = []
    mem_wts: list[np.ndarray] = []
    held = merged_len = 0
    files = ([(open(workdir / f"coarse_{k}.key", "wb"), open(workdir / f"coarse_{k}.w", "wb")) for k in range(K)]
             if K > 1 else [])

    def merge(keys: list[np.ndarray], wts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        if not keys:
            return np.zeros(0, np.int64), np.zeros(0)
        k, inv = np.unique(np.concatenate(keys), return_inverse=True)
        return k, np.bincount(inv.reshape(-1), weights=np.concatenate(wts), minlength=len(k))

    try:
        for s, e in node_chunks(indptr, edge_budget):
            row, nbr, lo = _range(indptr, indices, s, e)
            a, b = cluster[s + row], cluster[nbr]
            cross = a != b
            k = a[cross] * C + b[cross]
            w = (np.ones(len(k)) if eweights is None
                 else np.asarray(eweights[lo:lo + len(nbr)], dtype=np.float64)[cross])
            del row, nbr, a, b, cross
            uk, inv = np.unique(k, return_inverse=True)
            uw = np.bincount(inv.reshape(-1), weights=w, minlength=len(uk))
            del k, w, inv
            if K == 1:
                mem_keys.append(uk)
                mem_wts.append(uw)
                held += len(uk)
                if held > 2 * merged_len + 4 * edge_budget:
                    mk, mw = merge(mem_keys, mem_wts)
                    mem_keys[:], mem_wts[:] = [mk], [mw]
                    merged_len = held = len(mk)
                continue
            cut = np.searchsorted(uk, kb)
            for j in np.flatnonzero(np.diff(cut)):
                files[j][0].write(uk[cut[j]:cut[j + 1]].tobytes())
                files[j][1].write(uw[cut[j]:cut[j + 1]].astype(wdt).tobytes())
    finally:
        for fk, fw in files:
            fk.close()
            fw.close()
    # merge each bucket; a histogram of the weights picks the threshold
    merged: list[tuple[np.ndarray, np.ndarray]] = []
    hist = np.zeros(_HIST + 1, dtype=np.int64)
    for j in range(K):
        if K == 1:
            mk, mw = merge(mem_keys, mem_wts)
            mem_keys.clear()
            mem_wts.clear()
        else:
            kf, wf = workdir / f"coarse_{j}.key", workdir / f"coarse_{j}.w"
            mk, mw = merge([np.fromfile(kf, dtype=np.int64)], [np.fromfile(wf, dtype=wdt).astype(np.float64)])
            kf.unlink()
            wf.unlink()
        mw = np.rint(mw).astype(np.int64)
        hist += np.bincount(np.minimum(mw, _HIST), minlength=_HIST + 1)
        if K == 1:
            merged.append((mk, mw))
        else:  # back to disk merged: one bucket's pairs in memory at a time
            mk.tofile(workdir / f"merged_{j}.key")
            mw.tofile(workdir / f"merged_{j}.w")
        del mk, mw
    total = int(hist.sum())
    tau = 0
    if total > max_entries:  # the smallest t with #(w >= t) <= max_entries
        kept = total - np.concatenate([[0], np.cumsum(hist)])  # kept[t] = #(w >= t)
        tau = int(np.argmax(kept <= max_entries))
    keys: list[np.ndarray] = []
    wts: list[np.ndarray] = []
    for j in range(K):
        if K == 1:
            mk, mw = merged.pop() if merged else (np.zeros(0, np.int64), np.zeros(0, np.int64))
        else:
            kf, wf = workdir / f"merged_{j}.key", workdir / f"merged_{j}.w"
            mk, mw = np.fromfile(kf, dtype=np.int64), np.fromfile(wf, dtype=np.int64)
            kf.unlink()
            wf.unlink()
        sel = mw >= tau
        keys.append(mk[sel])
        wts.append(mw[sel])
        del mk, mw, sel
    k = np.concatenate(keys) if keys else np.zeros(0, np.int64)
    w = np.concatenate(wts) if wts else np.zeros(0, np.int64)
    del keys, wts
    xadj = np.zeros(C + 1, dtype=np.int64)
    np.cumsum(np.bincount(k // C, minlength=C), out=xadj[1:])
    return xadj, k % C, w


def _coarsen(indptr: np.ndarray, indices: np.ndarray, vweights: np.ndarray | None, eweights: np.ndarray | None,
             cap: float, seed: int, edge_budget: int, workdir: Path | None = None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One level: ``(cluster [N], xadj, adjncy, eweights, vweights)`` of the coarse graph."""
    N = len(indptr) - 1
    labels = label_propagation(indptr, indices, cap=cap, seed=seed, vweights=vweights, eweights=eweights,
                               edge_budget=edge_budget)
    # clusters numbered by their seed's id (np.unique's inverse, without its sort of N keys)
    present = np.zeros(N, dtype=bool)
    present[labels] = True
    remap = np.cumsum(present, dtype=np.int64) - 1
    del present
    cluster = remap[labels]
    del remap, labels
    C = int(cluster.max()) + 1 if N else 0
    vw = np.ones(N, dtype=np.int64) if vweights is None else np.asarray(vweights, dtype=np.int64)
    cw = np.bincount(cluster, weights=vw, minlength=C).astype(np.int64)
    xadj, adjncy, ew = _coarse_graph(indptr, indices, cluster, C, eweights, edge_budget, cw=cw, workdir=workdir)
    # Pack clusters without outside edges into groups of at most `cap` weight: otherwise a
    # graph of many small components keeps one coarse vertex per component.
    lonely = np.flatnonzero(np.diff(xadj) == 0)
    if len(lonely) > 1:
        group = np.floor_divide(np.cumsum(cw[lonely]) - cw[lonely], max(cap, 1)).astype(np.int64)
        connected = np.flatnonzero(np.diff(xadj) > 0)
        remap = np.empty(C, dtype=np.int64)
        remap[connected] = np.arange(len(connected))
        remap[lonely] = len(connected) + group
        C2 = len(connected) + int(group[-1]) + 1
        cluster = remap[cluster]
        cw = np.bincount(remap, weights=cw, minlength=C2).astype(np.int64)
        adjncy = remap[adjncy]
        xadj = np.concatenate([xadj[np.append(connected, C)], np.full(C2 - len(connected), xadj[-1])])
    return cluster, xadj, adjncy, ew, cw


def lp_metis_csr(csr: SymmetricCSR, num_parts: int, *, seed: int = 0, objective: str = "cut",
                 cap_factor: int = CAP_FACTOR, refine: bool = True, edge_budget: int = EDGE_BUDGET) -> np.ndarray:
    """``[N]`` int64 part ids in ``[0, num_parts)`` of the graph ``csr`` (module docstring);
    the first level's cluster pairs spill into ``csr.workdir`` when it has one.
    Raises :class:`PartitionError` when METIS fails or leaves a part empty."""
    N, P = csr.num_nodes, int(num_parts)
    if P == 1:
        return np.zeros(N, dtype=np.int64)
    if P > N:
        raise PartitionError(f"cannot split {N} nodes into {P} partitions")
    cap = max(1.0, N / (P * cap_factor))
    maps: list[np.ndarray] = []
    xadj, adjncy, ew, vw = csr.indptr, csr.indices, None, None
    for level in range(MAX_LEVELS):
        n_before = len(xadj) - 1
        cluster, xadj, adjncy, ew, vw = _coarsen(xadj, adjncy, vw, ew, cap, seed + level, edge_budget,
                                                 csr.workdir if level == 0 else None)
        maps.append(cluster)
        n_after = len(xadj) - 1
        if n_after <= COARSE_MAX_NODES or n_after > 0.9 * n_before:
            break
    idx = pymetis.zero_copy_dtype()
    if len(adjncy) >= 2**31 and idx == np.int32:
        raise PartitionError(f"the coarse graph has {len(adjncy)} entries, too many for a 32-bit METIS; "
                             f"use method='random'")
    opts = pymetis.Options(seed=int(seed % 2**31), objtype=int({"cut": pymetis.ObjType.CUT,
                                                                 "vol": pymetis.ObjType.VOL}[objective]))
    try:
        res = pymetis.part_graph(P, xadj=xadj.astype(idx), adjncy=adjncy.astype(idx), vweights=vw.astype(idx),
                                 eweights=ew.astype(idx), recursive=False, options=opts)
    except (RuntimeError, MemoryError) as exc:
        raise PartitionError(f"METIS failed on the coarse graph of {len(xadj) - 1} clusters: "
                             f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    parts = np.asarray(res.vertex_part, dtype=np.int64)
    for cluster in reversed(maps):
        parts = parts[cluster]
    if refine:
        refine_boundary(csr.indptr, csr.indices, parts, P, edge_budget=edge_budget)
    sizes = np.bincount(parts, minlength=P)
    if (sizes == 0).any():
        raise PartitionError(f"lp-metis left {int((sizes == 0).sum())} of {P} partitions empty for {N} nodes; "
                             f"use fewer parts or method='random'")
    return parts


def refine_boundary(indptr: np.ndarray, indices: np.ndarray, parts: np.ndarray, num_parts: int, *,
                    eps: float = EPS, edge_budget: int = EDGE_BUDGET) -> int:
    """One greedy pass in place: a node moves to the part holding strictly more of its
    neighbours than its own part, if that part stays within ``(1 + eps) N / P`` nodes (and
    never below ``N / P / (1 + eps)`` for the part it leaves); a range's movers into a part
    are admitted by gain, then id. Returns the number of nodes moved."""
    N, P = len(parts), num_parts
    hi_cap = math.floor((1 + eps) * N / P)
    lo_cap = math.ceil(N / P / (1 + eps))
    size = np.bincount(parts, minlength=P).astype(np.int64)
    moved = 0
    for s, e in node_chunks(indptr, edge_budget, max_nodes=max(1, (1 << 23) // P)):
        row, nbr, _ = _range(indptr, indices, s, e)
        if len(nbr) == 0:
            continue
        n = e - s
        cnt = np.bincount(row * P + parts[nbr], minlength=n * P).reshape(n, P)
        cur = parts[s:e]
        own = cnt[np.arange(n), cur]
        best = cnt.argmax(1)
        gain = cnt[np.arange(n), best] - own
        cand = np.flatnonzero(gain > 0)
        if len(cand) == 0:
            continue
        dest, g = best[cand], gain[cand]
        o = np.lexsort((cand, -g, dest))
        cand, dest = cand[o], dest[o]
        starts = np.flatnonzero(np.concatenate([[True], dest[1:] != dest[:-1]]))
        rank_in = np.arange(len(dest)) - np.repeat(starts, np.diff(np.append(starts, len(dest))))
        ok = rank_in < (hi_cap - size[dest])
        cand, dest = cand[ok], dest[ok]
        # the parts left behind must keep at least lo_cap nodes: admit leavers in order
        src = cur[cand]
        o = np.argsort(src, kind="stable")
        cand, dest, src = cand[o], dest[o], src[o]
        starts = np.flatnonzero(np.concatenate([[True], src[1:] != src[:-1]])) if len(src) else starts[:0]
        rank_out = np.arange(len(src)) - np.repeat(starts, np.diff(np.append(starts, len(src))))
        ok = rank_out < (size[src] - lo_cap)
        cand, dest, src = cand[ok], dest[ok], src[ok]
        np.subtract.at(size, src, 1)
        np.add.at(size, dest, 1)
        parts[s + cand] = dest
        moved += len(cand)
    return moved


@PARTITIONERS.register("lp-metis")
def lp_metis_partition(edge_index: Tensor, num_nodes: int, num_parts: int, cfg: PartitionConfig) -> Tensor:
    """``[num_nodes]`` int64 part ids: the CSR of ``edge_index`` built in memory, then
    :func:`lp_metis_csr` (the same parts as the on-disk path for the same graph and seed)."""
    ei = edge_index.numpy()
    csr = build_symmetric_csr(array_edge_chunks(ei[0], ei[1]), num_nodes)
    return torch.from_numpy(lp_metis_csr(csr, num_parts, seed=cfg.seed, objective=cfg.objective))
