"""The fused CPU kernels (commgnn.kernels) against torch's path: forward and backward to 1e-5."""

from __future__ import annotations

import pytest
import torch

from commgnn import kernels
from commgnn.errors import ConfigError
from commgnn.models.gat import GATLayer
from commgnn.models.graph import LocalGraph, spmm
from commgnn.trainers.config import TrainConfig

pytestmark = pytest.mark.skipif(not kernels.available(), reason="numba is not installed")


def _graph(n_own: int, n_src: int, e: int, seed: int, kernel: str) -> LocalGraph:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n_src, (e,), generator=g)
    dst = torch.randint(0, n_own, (e,), generator=g)
    dst[: n_own // 4] = 0  # one heavy row, and (with high probability) some rows with no in-edge
    deg = torch.randint(0, 30, (n_src,), generator=g)
    return LocalGraph(num_own=n_own, num_src=n_src, edge_index=torch.stack([src, dst]), in_degree=deg,
                      kernel=kernel)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("op", ["gcn_adj", "mean_adj"])
def test_csr_spmm_matches_torch_forward_and_backward(dtype: torch.dtype, op: str) -> None:
    outs = {}
    x0 = torch.randn(300, 37, dtype=dtype, generator=torch.Generator().manual_seed(1))
    w = torch.randn(200, 37, dtype=dtype, generator=torch.Generator().manual_seed(2))
    for kernel in ("torch", "numba"):
        graph = _graph(200, 300, 3000, 0, kernel)
        x = x0.clone().requires_grad_(True)
        y = spmm(getattr(graph, op)(dtype), x)
        (y * w).sum().backward()
        outs[kernel] = (y.detach(), x.grad)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(outs["numba"][0], outs["torch"][0], rtol=tol, atol=tol)
    torch.testing.assert_close(outs["numba"][1], outs["torch"][1], rtol=tol, atol=tol)
    assert outs["numba"][0].abs().sum() > 0  # a vacuous all-zero product would also "match"


def test_csr_spmm_reuses_a_buffer_and_handles_empty_rows() -> None:
    indptr = torch.tensor([0, 2, 2, 3])           # row 1 has no entries
    indices = torch.tensor([0, 2, 1])
    values = torch.tensor([1.0, 2.0, -1.0])
    x = torch.arange(6, dtype=torch.float32).view(3, 2)
    out = torch.full((3, 2), 99.0)                # garbage the kernel must overwrite
    got = kernels.csr_spmm(indptr, indices, values, x, 3, out)
    assert got.data_ptr() == out.data_ptr()
    torch.testing.assert_close(got, torch.tensor([[8.0, 11.0], [0.0, 0.0], [-2.0, -3.0]]))


@pytest.mark.parametrize("concat,heads", [(True, 4), (False, 1)])
def test_fused_gat_matches_torch_layer(concat: bool, heads: int) -> None:
    """The whole layer (attention halves, softmax, aggregation, bias) and every parameter's
    gradient agree between the fused kernel and PyG's edge softmax + index_add_."""
    torch.manual_seed(0)
    layer = GATLayer(24, 8, heads, concat=concat)
    x0 = torch.randn(300, 24)
    results = {}
    for kernel in ("torch", "numba"):
        graph = _graph(200, 300, 3000, 3, kernel)
        layer.zero_grad()
        x = x0.clone().requires_grad_(True)
        out = layer.combine(x, x[:200], graph)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        results[kernel] = [out.detach(), x.grad] + [p.grad.clone() for p in layer.parameters()]
    assert graph.fused_attention() is not None  # the numba run really took the fused path
    for got, want in zip(results["numba"], results["torch"]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_fused_gat_gradcheck_float64() -> None:
    graph = _graph(30, 45, 200, 4, "numba").fused_attention()
    assert graph is not None
    g = torch.Generator().manual_seed(5)
    x = torch.randn(45, 3, 4, dtype=torch.float64, generator=g, requires_grad=True)
    s = torch.randn(45, 3, dtype=torch.float64, generator=g, requires_grad=True)
    d = torch.randn(30, 3, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, c: kernels.gat_attend(a, b, c, graph), (x, s, d))


def test_attention_dropout_in_training_keeps_the_torch_path() -> None:
    """The fused kernel has no per-edge dropout: with it, training must not use the kernel
    (else dropout would silently vanish); evaluation may."""
    layer = GATLayer(8, 4, 2, attn_dropout=0.9)
    graph = _graph(40, 60, 400, 6, "numba")
    x = torch.randn(60, 8)
    layer.train()
    torch.manual_seed(0)
    a = layer.combine(x, x[:40], graph)
    torch.manual_seed(1)
    b = layer.combine(x, x[:40], graph)
    assert not torch.allclose(a, b)               # dropout acted: two masks, two outputs
    layer.eval()
    torch.testing.assert_close(layer.combine(x, x[:40], graph),
                               layer.combine(x, x[:40], _graph(40, 60, 400, 6, "torch")), rtol=1e-5, atol=1e-5)


def test_kernel_config() -> None:
    assert TrainConfig(kernel="auto").resolved_kernel == "numba"
    assert TrainConfig(kernel="auto", mode="minibatch").resolved_kernel == "torch"  # small per-step blocks
    assert TrainConfig(kernel="numba", mode="minibatch").resolved_kernel == "numba"  # asked for: given
    assert TrainConfig(kernel="torch").resolved_kernel == "torch"
    with pytest.raises(ConfigError, match="train.kernel"):
        TrainConfig(kernel="cuda")  # type: ignore[arg-type]


def test_kernel_numba_refused_without_numba(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "available", lambda: False)
    with pytest.raises(ConfigError, match="pip install"):
        TrainConfig(kernel="numba")
    assert TrainConfig(kernel="auto").resolved_kernel == "torch"
    graph = _graph(20, 30, 100, 7, "numba")      # falls back to torch's product, same values
    x = torch.randn(30, 5)
    torch.testing.assert_close(spmm(graph.gcn_adj(torch.float32), x),
                               spmm(_graph(20, 30, 100, 7, "torch").gcn_adj(torch.float32), x))
    assert graph.fused_attention() is None


_ONE_THREAD = """
import numba, torch
from commgnn import kernels
from commgnn.models.gat import GATLayer
from test_kernels import _graph
from commgnn.models.graph import spmm
kernels.set_threads(1)
g = _graph(200, 300, 3000, 0, "numba")
x = torch.randn(300, 8, requires_grad=True)
spmm(g.gcn_adj(torch.float32), x).sum().backward()
layer = GATLayer(8, 4, 2)
layer.eval()
layer.combine(x.detach(), x.detach()[:200], g)
try:
    numba.threading_layer()
    print("pool started")
except ValueError:
    print("no pool")
"""


def test_one_thread_runs_serial_kernels_and_never_starts_the_pool() -> None:
    """At one thread a rank must not start numba's OpenMP pool: its workers spin between
    parallel regions and, with 8 ranks on 2 cores, made epochs 14x longer. A fresh
    interpreter, since this one may have started the pool in other tests."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here), str(here.parent)])}
    out = subprocess.run([sys.executable, "-c", _ONE_THREAD], env=env, capture_output=True, text=True,
                         timeout=240, check=True).stdout
    assert out.strip().splitlines()[-1] == "no pool"


def test_serial_and_parallel_compilations_give_the_same_bits() -> None:
    """Each output row is one thread's sum in the same order: thread count changes no bit."""
    g = torch.Generator().manual_seed(3)
    indptr = torch.cat([torch.zeros(1, dtype=torch.long), torch.randint(0, 9, (500,), generator=g).cumsum(0)])
    indices = torch.randint(0, 400, (int(indptr[-1]),), generator=g)
    values = torch.randn(int(indptr[-1]), generator=g)
    x = torch.randn(400, 33, generator=g)
    kernels.set_threads(1)
    ref = kernels.csr_spmm(indptr, indices, values, x, 500)
    kernels.set_threads(2)  # the parallel compilation (on as many threads as numba has, up to 2)
    try:
        assert torch.equal(kernels.csr_spmm(indptr, indices, values, x, 500), ref)
    finally:
        kernels.set_threads(torch.get_num_threads())
