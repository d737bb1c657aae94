"""GCN's local order (aggregate first or transform first) changes flops and memory, not values."""

from __future__ import annotations

import pytest
import torch

from commgnn.models.gcn import GCNLayer
from commgnn.models.graph import LocalGraph


@pytest.mark.parametrize("d_in,d_out,aggregate_first", [(16, 16, True), (64, 4, False)])
def test_both_orders_match_the_dense_formula(d_in: int, d_out: int, aggregate_first: bool) -> None:
    g = torch.Generator().manual_seed(0)
    n_own, n_src, e = 100, 300, 1000                      # a halo twice the owned rows, as on a cut graph
    src = torch.randint(0, n_src, (e,), generator=g)
    dst = torch.randint(0, n_own, (e,), generator=g)
    deg = torch.randint(1, 20, (n_src,), generator=g)
    graph = LocalGraph(num_own=n_own, num_src=n_src, edge_index=torch.stack([src, dst]), in_degree=deg,
                       kernel="torch")
    layer = GCNLayer(d_in, d_out).double()
    nnz = graph.gcn_adj(torch.float64).a.values().numel()
    assert layer._aggregate_first(n_own, n_src, nnz) is aggregate_first
    x = torch.randn(n_src, d_in, dtype=torch.float64, generator=g, requires_grad=True)
    out = layer.combine(x, x[:n_own], graph)
    # The dense reference: D^-1/2 (A + I) D^-1/2 restricted to owned rows, then X W^T + b.
    a = torch.zeros(n_own, n_src, dtype=torch.float64)
    dinv = (deg.double() + 1).pow(-0.5)
    a.index_put_((dst, src), dinv[dst] * dinv[src], accumulate=True)
    a[torch.arange(n_own), torch.arange(n_own)] += dinv[:n_own] ** 2
    want = a @ (x @ layer.lin.weight.t()) + layer.bias
    torch.testing.assert_close(out, want)
    w = torch.randn_like(out)
    got = torch.autograd.grad((out * w).sum(), (x, layer.lin.weight))
    ref = torch.autograd.grad((want * w).sum(), (x, layer.lin.weight))
    for a_, b_ in zip(got, ref):
        torch.testing.assert_close(a_, b_)
