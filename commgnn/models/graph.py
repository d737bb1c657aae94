"""The model-side view of a rank's graph, and the CSR aggregation kernel.

A rank aggregates into its ``n_own`` owned rows from ``n_src = n_own + n_halo`` source
rows (owned first, then halo; see :mod:`commgnn.partition.local`). Aggregation is a
sparse-dense product with a rectangular CSR matrix ``A: [n_own, n_src]``:

    out[i] = sum_j A[i, j] * X[j]          X: [n_src, d] -> out: [n_own, d]

``torch.sparse.mm(A_csr, X, reduce="sum")`` is the fastest CPU path measured here
(techniques.md section 8), and its backward ``grad_X = A^T grad_out`` runs the same kernel
on a transpose kept in CSR, built once (:class:`SpMM`), instead of autograd's slower
generic sparse backward.

``kernel = "numba"`` runs the same products through the fused CSR loop of
:mod:`commgnn.kernels` (CPU tensors; torch's kernel elsewhere, and whenever numba is
absent), and GAT's attention through its fused kernel.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from commgnn import kernels


def _csr(rows: Tensor, cols: Tensor, vals: Tensor, shape: tuple[int, int]) -> Tensor:
    """The CSR matrix of the entries ``(rows[k], cols[k], vals[k])`` (duplicates summed), with
    int32 indices where they fit.

    Built from one sort of the row-major keys ``row * n + col`` rather than through a
    coalesced COO tensor: the temporaries are the keys and the permutation (16 bytes per
    entry), not a stacked ``[2, nnz]`` index and its coalesced copy, and the stored indices
    take 4 bytes each instead of 8, which is most of a large graph's topology."""
    m, n = shape
    key, order = torch.sort(rows * n + cols, stable=True)
    val = vals[order]
    del order
    if key.numel() > 1 and bool((key[1:] == key[:-1]).any()):  # a multigraph: sum the duplicates
        key, inv = torch.unique_consecutive(key, return_inverse=True)
        val = torch.zeros(key.numel(), dtype=val.dtype, device=val.device).index_add_(0, inv, val)
        del inv
    idx = torch.int32 if max(m, n, key.numel()) < 2**31 else torch.int64
    crow = torch.zeros(m + 1, dtype=torch.int64, device=key.device)
    crow[1:] = torch.cumsum(torch.bincount(torch.div(key, n, rounding_mode="floor"), minlength=m), 0)
    col = torch.remainder(key, n).to(idx)
    del key
    with warnings.catch_warnings():  # torch's "CSR support is in beta" notice, once per build
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow.to(idx), col, val, shape)


Kernel = str
"""``"torch"`` (``torch.sparse.mm``) or ``"numba"`` (:mod:`commgnn.kernels`)."""
KERNELS = ("torch", "numba")


def csr_product(a: Tensor, x: Tensor, kernel: Kernel) -> Tensor:
    """``a @ x`` for CSR ``a: [m, n]`` and dense ``x: [n, f]``, by ``kernel``'s SpMM."""
    if x.device.type != "cpu":  # reduce= exists on CPU only; plain sparse.mm is cuSPARSE's SpMM
        return torch.sparse.mm(a, x)
    if kernel == "numba" and kernels.available():
        return kernels.csr_spmm(a.crow_indices(), a.col_indices(), a.values(), x, a.shape[0])
    return torch.sparse.mm(a, x, reduce="sum")


_product = csr_product


@dataclass
class CSRPair:
    """``A`` and ``A^T``, both CSR, for forward and backward aggregation."""

    a: Tensor
    at: Tensor
    kernel: Kernel = "torch"
    """Which SpMM runs the products (see :data:`KERNELS`)."""

    def squared(self) -> "CSRPair":
        """The operator with every entry squared, ``A o A`` (variances of ``A x``)."""
        def sq(t: Tensor) -> Tensor:
            with warnings.catch_warnings():  # torch's "CSR support is in beta" notice
                warnings.simplefilter("ignore", UserWarning)
                return torch.sparse_csr_tensor(t.crow_indices(), t.col_indices(), t.values().square(), t.shape)
        return CSRPair(sq(self.a), sq(self.at), self.kernel)

    @staticmethod
    def build(rows: Tensor, cols: Tensor, vals: Tensor, shape: tuple[int, int],
              kernel: Kernel = "torch") -> "CSRPair":
        return CSRPair(_csr(rows, cols, vals, shape), _csr(cols, rows, vals, (shape[1], shape[0])), kernel)


class _SpMMFn(torch.autograd.Function):
    @staticmethod
    def forward(fctx: Any, x: Tensor, pair: CSRPair) -> Tensor:  # type: ignore[override]
        fctx.pair = pair
        return _product(pair.a, x, pair.kernel)

    @staticmethod
    def backward(fctx: Any, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        return _product(fctx.pair.at, grad.contiguous(), fctx.pair.kernel), None


def spmm(pair: CSRPair, x: Tensor) -> Tensor:
    """``A @ x`` for ``x: [n_src, d]`` (any trailing shape is flattened and restored)."""
    shape = x.shape
    out = _SpMMFn.apply(x.reshape(shape[0], math.prod(shape[1:])), pair)  # not -1: x may have 0 rows
    return out.reshape(out.shape[0], *shape[1:])


@dataclass
class LocalGraph:
    """Topology a rank's layers aggregate over, with per-model operators built once."""

    num_own: int
    """Rows aggregated into (owned nodes)."""
    num_src: int
    """Source rows: owned then halo."""
    edge_index: Tensor
    """``[2, E]`` local edges, sources in ``[0, num_src)``, targets in ``[0, num_own)``."""
    in_degree: Tensor
    """``[num_src]`` global in-degree of every source row (no self loops)."""
    kernel: Kernel = "torch"
    """Aggregation kernel: ``torch`` or ``numba`` (fused CPU loops, :mod:`commgnn.kernels`)."""
    _cache: dict[Any, Any] = field(default_factory=dict, repr=False)

    def gcn_adj(self, dtype: torch.dtype) -> CSRPair:
        """``D^-1/2 (A + I) D^-1/2`` restricted to owned targets, ``d_i = in_degree_i + 1``
        (PyG's ``gcn_norm`` with self loops of weight 1)."""
        def entries() -> tuple[Tensor, Tensor, Tensor]:
            src, dst = self.edge_index
            own = torch.arange(self.num_own, device=src.device)
            rows, cols = torch.cat([dst, own]), torch.cat([src, own])
            dinv = (self.in_degree.to(torch.float64) + 1).pow(-0.5)
            return rows, cols, dinv[rows] * dinv[cols]
        return self._pair("gcn", dtype, entries)

    def mean_adj(self, dtype: torch.dtype) -> CSRPair:
        """Row-normalised adjacency: ``out_i = mean_{j -> i} x_j`` (0 for no in-edges)."""
        def entries() -> tuple[Tensor, Tensor, Tensor]:
            src, dst = self.edge_index
            deg = torch.bincount(dst, minlength=self.num_own).clamp(min=1).to(torch.float64)
            return dst, src, 1.0 / deg[dst]
        return self._pair("mean", dtype, entries)

    def _pair(self, name: str, dtype: torch.dtype, entries: Any) -> CSRPair:
        if (name, dtype) not in self._cache:
            rows, cols, vals = entries()
            self._cache[name, dtype] = CSRPair.build(rows, cols, vals.to(dtype), (self.num_own, self.num_src),
                                                     self.kernel)
        return self._cache[name, dtype]

    def edges_with_self_loops(self) -> Tensor:
        """Local edges plus one self loop per owned node (GAT's neighbourhoods)."""
        if "loops" not in self._cache:
            own = torch.arange(self.num_own, device=self.edge_index.device)
            self._cache["loops"] = torch.cat([self.edge_index, torch.stack([own, own])], dim=1)
        return self._cache["loops"]

    def fused_attention(self) -> "kernels.AttentionGraph | None":
        """The self-looped edges as the fused GAT kernel's CSR pair, or ``None`` when this
        graph runs the torch kernel (or numba is absent)."""
        if self.kernel != "numba" or not kernels.available() or self.edge_index.device.type != "cpu":
            return None
        if "attention" not in self._cache:
            self._cache["attention"] = kernels.AttentionGraph.build(self.edges_with_self_loops(),
                                                                   self.num_own, self.num_src)
        return self._cache["attention"]
