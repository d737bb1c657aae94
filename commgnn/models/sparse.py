"""Sparse input features: the first layer's linear maps on a fixed sparsity pattern.

Bag-of-words features are mostly zeros (Coauthor CS: 0.9% non-zero of 6,805 columns), and
the first layer's ``X W^T`` on dense rows dominates an epoch. The pattern of ``X`` is fixed
(dropout only zeroes entries), so :class:`SparseRows` keeps it once, in CSR for ``X`` and
for ``X^T``, and each epoch only gathers the values:

    forward:   out    = X_csr @ W^T          X: [n, d_in] (nnz values), W: [d_out, d_in]
    backward:  grad_W = (X^T_csr @ grad_out)^T

What travels between ranks does not change: halo rows are still sent as the exact mode
sends them (the time it saves is on the docs' CPU kernels results page). Written here because torch's default backward
of a CSR product builds the transpose every call and loses the gain.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from commgnn.models.dropout import dropout

Projector = Callable[[Tensor, Tensor], Tensor]
"""``(rows [n, d_in], weight [d_out, d_in]) -> rows W^T [n, d_out]``."""


def dense_proj(t: Tensor, weight: Tensor) -> Tensor:
    return F.linear(t, weight)


def _csr(crow: Tensor, col: Tensor, values: Tensor, shape: tuple[int, int]) -> Tensor:
    with warnings.catch_warnings():  # torch's "CSR support is in beta" notice
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, col, values, shape, check_invariants=False)


class _SparseLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(fctx: Any, values: Tensor, weight: Tensor, rows: "SparseRows") -> Tensor:  # type: ignore[override]
        fctx.save_for_backward(values)
        fctx.rows = rows
        a = _csr(rows.crow, rows.col, values, rows.shape)
        return torch.sparse.mm(a, weight.t().contiguous())

    @staticmethod
    def backward(fctx: Any, grad: Tensor) -> tuple[None, Tensor, None]:  # type: ignore[override]
        (values,) = fctx.saved_tensors
        r: SparseRows = fctx.rows
        at = _csr(r.crow_t, r.col_t, values[r.perm_t], (r.shape[1], r.shape[0]))
        return None, torch.sparse.mm(at, grad.contiguous()).t(), None


class SparseRows:
    """The non-zero pattern of a constant ``[n, d]`` matrix, as CSR for it and its transpose."""

    def __init__(self, dense: Tensor) -> None:
        rows, cols = dense.nonzero(as_tuple=True)  # row-major: CSR order
        self._build(rows, cols, (dense.shape[0], dense.shape[1]))

    def head(self, n: int) -> "SparseRows":
        """The pattern of the first ``n`` rows: a prefix of the CSR arrays (its values are
        the first ``int(crow[n])`` values of this pattern's)."""
        nnz = int(self.crow[n])
        out = SparseRows.__new__(SparseRows)
        out._build(self.rows[:nnz], self.cols[:nnz], (n, self.shape[1]))
        return out

    def _build(self, rows: Tensor, cols: Tensor, shape: tuple[int, int]) -> None:
        n, d = shape
        self.shape = (n, d)
        self.rows, self.cols = rows, cols
        dev = rows.device
        zero = torch.zeros(1, dtype=torch.long, device=dev)
        self.crow = torch.cat([zero, torch.bincount(self.rows, minlength=n).cumsum(0)])
        self.col = self.cols.contiguous()
        self.perm_t = torch.argsort(self.cols * n + self.rows)  # column-major order
        self.crow_t = torch.cat([zero, torch.bincount(self.cols, minlength=d).cumsum(0)])
        self.col_t = self.rows[self.perm_t].contiguous()

    @property
    def density(self) -> float:
        return self.rows.numel() / max(self.shape[0] * self.shape[1], 1)

    def gather(self, dense: Tensor) -> Tensor:
        """The values of ``dense`` at this pattern (entries elsewhere must be zero)."""
        return dense[self.rows, self.cols]

    def linear(self, values: Tensor, weight: Tensor) -> Tensor:
        return _SparseLinearFn.apply(values, weight, self)


def matched_dropout(pre: Tensor, sigma: Tensor, p: float, training: bool) -> Tensor:
    """``pre + sigma * xi`` with ``xi = m / (1 - p) - 1``, ``m ~ Bernoulli(1 - p)`` per entry:
    the mean of ``pre`` and the variance ``sigma^2 p / (1 - p)``. With ``pre = A X`` and
    ``sigma^2 = (A o A)(X o X)`` (o: element-wise) that is, entry by entry, the mean and the
    variance of the exact model's ``A dropout(X)`` (whose noise sums over a node's neighbours,
    so it is up to degree-times smaller than dropout on ``A X`` itself). Shapes: any, equal."""
    if not training or p == 0.0:
        return pre
    return pre + sigma * (dropout(torch.ones_like(pre), p, True) - 1.0)


class SparseProj:
    """A :data:`Projector` for rows with a known pattern, optionally with dropout on the values
    (the same distribution as dropout on the dense rows: zeros stay zero), or, given
    ``sigma`` (values on the pattern), the noise ``sigma * (m / (1 - p) - 1)`` added instead
    (:func:`matched_dropout`)."""

    def __init__(self, rows: SparseRows, dropout: float = 0.0, training: bool = False, *,
                 sigma: Tensor | None = None) -> None:
        self.rows, self.dropout, self.training, self.sigma = rows, dropout, training, sigma

    def __call__(self, t: Tensor, weight: Tensor) -> Tensor:
        values = self.rows.gather(t)
        if self.dropout and self.training:
            if self.sigma is None:
                values = dropout(values, self.dropout, training=True)
            else:
                values = matched_dropout(values, self.sigma, self.dropout, True)
        return self.rows.linear(values, weight)
