"""A fused CSR sparse-dense product on CPU, compiled with numba.

For a CSR matrix ``A: [m, n]`` (``indptr [m+1]``, ``indices [nnz]``, ``values [nnz]``) and
dense rows ``X: [n, f]``::

    out[i, :] = sum_{p in indptr[i] .. indptr[i+1]-1} values[p] * X[indices[p], :]      out: [m, f]

One pass, one thread per block of output rows (``prange``), the inner ``f`` loop
vectorised; each output row is written exactly once, so there are no atomics and no
zero-fill pass over ``out`` beforehand. The traffic that must move is one gathered row of
``X`` per stored entry plus the index and value arrays: ``nnz * (4 f + 8 + 4)`` bytes in
fp32 with int64 indices.

GCN's symmetric normalisation and GraphSAGE's mean are folded into ``values`` once, when
the operator is built (:class:`commgnn.models.graph.LocalGraph`), so the torch path makes
no extra pass for them either; what this kernel gains over ``torch.sparse.mm`` is the
tighter loop (measured in ``benchmarks/aggregation_kernels.py``). Written here because no
maintained CPU library offers a row-parallel CSR SpMM that numba can fuse; torch's
kernel stays the fallback whenever numba is absent.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from commgnn.kernels.jit import parallel_njit, prange


@parallel_njit(cache=True, fastmath=False, boundscheck=False)
def _spmm_rows(indptr: np.ndarray, indices: np.ndarray, values: np.ndarray, x: np.ndarray,
               out: np.ndarray) -> None:  # pragma: no cover - compiled
    m = indptr.shape[0] - 1
    f = x.shape[1]
    for i in prange(m):
        row = out[i]
        for k in range(f):
            row[k] = 0.0
        for p in range(indptr[i], indptr[i + 1]):
            j = indices[p]
            v = values[p]
            src = x[j]
            for k in range(f):
                row[k] += v * src[k]


def csr_spmm(indptr: Tensor, indices: Tensor, values: Tensor, x: Tensor, num_rows: int,
             out: Tensor | None = None) -> Tensor:
    """``A @ x`` for CSR ``A`` (``num_rows`` rows) and a contiguous CPU ``x: [n, f]``.

    ``out`` (``[num_rows, f]``, ``x``'s dtype), when given, is overwritten and returned:
    reusing a buffer avoids the page faults of a fresh large allocation."""
    x = x.contiguous()
    if out is None:
        out = torch.empty(num_rows, x.shape[1], dtype=x.dtype)
    if num_rows and x.shape[1]:
        _spmm_rows(indptr.numpy(), indices.numpy(), values.numpy(), x.numpy(), out.numpy())
    return out
