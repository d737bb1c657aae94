"""Fused CPU aggregation kernels (numba), behind torch fallbacks.

* :func:`csr_spmm`: ``A @ X`` for CSR ``A`` (GCN's and GraphSAGE's aggregation; their
  normalisation lives in ``A``'s values).
* :func:`gat_attend`: GAT's SDDMM, edge softmax and SpMM in one pass, with its backward.

A leaf package: it imports only torch, numpy and (optionally) numba. Callers choose the
kernel (``train.kernel``); without numba they keep the torch path.
"""

from commgnn.kernels.jit import AVAILABLE, set_threads


def available() -> bool:
    """Whether the compiled kernels can run here (numba is installed)."""
    return AVAILABLE


from commgnn.kernels.csr import csr_spmm  # noqa: E402
from commgnn.kernels.gat import AttentionGraph, gat_attend  # noqa: E402

__all__ = ["AttentionGraph", "available", "csr_spmm", "gat_attend", "set_threads"]
