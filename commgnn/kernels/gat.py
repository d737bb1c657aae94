"""GAT attention fused into CSR passes on CPU (SDDMM, softmax and SpMM in one loop), with numba.

For every target row ``i`` (its in-edges ``j -> i`` stored as a CSR row, self loop
included) and head ``h``, with transformed rows ``X: [n_src, H, C]`` and the per-node
attention halves ``s: [n_src, H]`` (``<a_src, X_j>``) and ``d: [n_own, H]``
(``<a_dst, X_i>``)::

    e_ij     = LeakyReLU(s_j + d_i, 0.2)
    alpha_ij = exp(e_ij - max_j e_ij) / sum_j exp(e_ij - max_j e_ij)
    out_i    = sum_j alpha_ij X_j                                           out: [n_own, H, C]

The torch path (:class:`commgnn.models.gat.GATLayer`) makes an ``[E, H]`` pass per step
(gather, add, leaky ReLU, segment max, exp, segment sum, divide) and then gathers
``X[src] * alpha`` into an ``[E, H, C]`` temporary before ``index_add_``: the
temporary alone is ``E H C`` floats written and read again. Here the forward pass reads
each neighbour row once and writes ``out`` and ``alpha [E, H]`` (kept for backward).

Backward, for ``G = dL/d out``::

    g_ij     = <G_i, X_j>                                   (per head)
    de_ij    = alpha_ij (g_ij - sum_k alpha_ik g_ik)          softmax
    dz_ij    = de_ij * (1 if s_j + d_i > 0 else 0.2)         leaky ReLU
    dd_i     = sum_j dz_ij
    ds_j     = sum_{i: j -> i} dz_ij
    dX_j     = sum_{i: j -> i} alpha_ij G_i

The first three lines run row-parallel over targets (pass 1, storing ``dz [E, H]``); the
sums over a source's out-edges run row-parallel over sources on the transposed CSR
(pass 2), so no two threads write one row. Written here because neither torch nor PyG
has a fused CPU GAT kernel; the torch path stays the fallback and the reference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from commgnn.kernels.jit import parallel_njit, prange

SLOPE = 0.2
"""GAT's LeakyReLU negative slope (PyG's default)."""


@parallel_njit(cache=True, boundscheck=False)
def _forward(indptr: np.ndarray, indices: np.ndarray, x: np.ndarray, s: np.ndarray, d: np.ndarray,
             out: np.ndarray, alpha: np.ndarray) -> None:  # pragma: no cover - compiled
    m = indptr.shape[0] - 1
    heads, chan = x.shape[1], x.shape[2]
    for i in prange(m):
        lo, hi = indptr[i], indptr[i + 1]
        for h in range(heads):
            top = -np.inf
            for p in range(lo, hi):
                z = s[indices[p], h] + d[i, h]
                e = z if z > 0 else SLOPE * z
                alpha[p, h] = e
                if e > top:
                    top = e
            total = 0.0
            for p in range(lo, hi):
                w = math.exp(alpha[p, h] - top)
                alpha[p, h] = w
                total += w
            inv = 1.0 / (total + 1e-16)  # PyG's softmax guards the sum the same way
            row = out[i, h]
            for k in range(chan):
                row[k] = 0.0
            for p in range(lo, hi):
                a = alpha[p, h] * inv
                alpha[p, h] = a
                src = x[indices[p], h]
                for k in range(chan):
                    row[k] += a * src[k]


@parallel_njit(cache=True, boundscheck=False)
def _backward_targets(indptr: np.ndarray, indices: np.ndarray, x: np.ndarray, s: np.ndarray,
                      d: np.ndarray, alpha: np.ndarray, g: np.ndarray, dz: np.ndarray,
                      dd: np.ndarray) -> None:  # pragma: no cover - compiled
    m = indptr.shape[0] - 1
    heads, chan = x.shape[1], x.shape[2]
    for i in prange(m):
        lo, hi = indptr[i], indptr[i + 1]
        for h in range(heads):
            gi = g[i, h]
            mean = 0.0
            for p in range(lo, hi):
                src = x[indices[p], h]
                dot = 0.0
                for k in range(chan):
                    dot += gi[k] * src[k]
                dz[p, h] = dot
                mean += alpha[p, h] * dot
            acc = 0.0
            for p in range(lo, hi):
                de = alpha[p, h] * (dz[p, h] - mean)
                if s[indices[p], h] + d[i, h] <= 0:
                    de *= SLOPE
                dz[p, h] = de
                acc += de
            dd[i, h] = acc


@parallel_njit(cache=True, boundscheck=False)
def _backward_sources(t_indptr: np.ndarray, t_rows: np.ndarray, t_perm: np.ndarray, alpha: np.ndarray,
                      g: np.ndarray, dz: np.ndarray, dx: np.ndarray, ds: np.ndarray) -> None:  # pragma: no cover
    n = t_indptr.shape[0] - 1
    heads, chan = g.shape[1], g.shape[2]
    for j in prange(n):
        for h in range(heads):
            row = dx[j, h]
            for k in range(chan):
                row[k] = 0.0
            acc = 0.0
            for q in range(t_indptr[j], t_indptr[j + 1]):
                p = t_perm[q]
                a = alpha[p, h]
                acc += dz[p, h]
                gi = g[t_rows[q], h]
                for k in range(chan):
                    row[k] += a * gi[k]
            ds[j, h] = acc


@dataclass(frozen=True)
class AttentionGraph:
    """In-edges of ``num_own`` targets from ``num_src`` sources, in CSR and transposed.

    ``indptr [num_own+1]``, ``indices [E]`` (source of each entry, CSR order);
    ``t_indptr [num_src+1]``, ``t_rows [E]`` (target of each transposed entry) and
    ``t_perm [E]`` (its position in CSR order)."""

    num_own: int
    num_src: int
    indptr: Tensor
    indices: Tensor
    t_indptr: Tensor
    t_rows: Tensor
    t_perm: Tensor

    @staticmethod
    def build(edge_index: Tensor, num_own: int, num_src: int) -> "AttentionGraph":
        """From ``[2, E]`` (source, target) edges, self loops already included."""
        src, dst = edge_index[0].long(), edge_index[1].long()
        order = torch.argsort(dst * num_src + src)
        indices = src[order].contiguous()
        rows = dst[order]
        indptr = torch.zeros(num_own + 1, dtype=torch.int64)
        indptr[1:] = torch.bincount(rows, minlength=num_own).cumsum(0)
        t_perm = torch.argsort(indices * num_own + rows)
        t_indptr = torch.zeros(num_src + 1, dtype=torch.int64)
        t_indptr[1:] = torch.bincount(indices, minlength=num_src).cumsum(0)
        return AttentionGraph(num_own, num_src, indptr, indices, t_indptr, rows[t_perm].contiguous(),
                              t_perm.contiguous())


class _FusedGAT(torch.autograd.Function):
    @staticmethod
    def forward(fctx: Any, x: Tensor, s: Tensor, d: Tensor, graph: AttentionGraph) -> Tensor:  # type: ignore[override]
        x, s, d = x.contiguous(), s.contiguous(), d.contiguous()
        heads, chan = x.shape[1], x.shape[2]
        out = torch.empty(graph.num_own, heads, chan, dtype=x.dtype)
        alpha = torch.empty(graph.indices.numel(), heads, dtype=x.dtype)
        _forward(graph.indptr.numpy(), graph.indices.numpy(), x.numpy(), s.numpy(), d.numpy(),
                 out.numpy(), alpha.numpy())
        fctx.save_for_backward(x, s, d, alpha)
        fctx.graph = graph
        return out

    @staticmethod
    def backward(fctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:  # type: ignore[override]
        x, s, d, alpha = fctx.saved_tensors
        g: AttentionGraph = fctx.graph
        grad = grad.contiguous()
        dz = torch.empty_like(alpha)
        dd = torch.empty_like(d)
        _backward_targets(g.indptr.numpy(), g.indices.numpy(), x.numpy(), s.numpy(), d.numpy(),
                          alpha.numpy(), grad.numpy(), dz.numpy(), dd.numpy())
        dx = torch.empty_like(x)
        ds = torch.empty_like(s)
        _backward_sources(g.t_indptr.numpy(), g.t_rows.numpy(), g.t_perm.numpy(), alpha.numpy(),
                          grad.numpy(), dz.numpy(), dx.numpy(), ds.numpy())
        return dx, ds, dd, None


def gat_attend(x: Tensor, s: Tensor, d: Tensor, graph: AttentionGraph) -> Tensor:
    """Fused attention-weighted aggregation: ``x [n_src, H, C]``, ``s [n_src, H]``,
    ``d [n_own, H]`` -> ``[n_own, H, C]`` (differentiable in all three)."""
    return _FusedGAT.apply(x, s, d, graph)
