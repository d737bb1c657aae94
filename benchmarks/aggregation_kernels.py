"""Aggregation kernels against PyG's MessagePassing, torch's CSR product and a STREAM yardstick.

At the shape of issue #15 (N = 200k nodes, E = 4M edges, F = 128, 2 threads), on the
same run, for each graph and node order:

* ``commgnn numba``: the fused CSR loop of :mod:`commgnn.kernels` (``train.kernel = numba``);
* ``torch CSR``: ``torch.sparse.mm(A_csr, X, reduce="sum")`` (``train.kernel = torch``);
* ``PyG MessagePassing``: a ``MessagePassing`` layer with ``aggr="add"`` and message
  ``w_e x_j`` on a plain ``edge_index`` (gather, then scatter);
* GAT attention (8 heads x 16): the fused kernel against the torch path of
  :class:`commgnn.models.gat.GATLayer` (PyG's edge softmax and ``index_add_``).

Forward ``A X`` and backward ``A^T G`` are timed separately (median of ``--reps``), and
checked against torch's result (max abs difference). Effective bandwidth counts what must
be read: one gathered feature row per edge plus its index and value, ``E (4 F + 12)``
bytes. STREAM triad (``a = b + s c`` on three 160 MB fp64 arrays, 24 bytes per element,
best of 10, both torch and numba; the larger is used) is the bandwidth yardstick.

Graphs: ``uniform`` (every edge's endpoints uniform: no locality exists to recover) and
``community`` (2,000 communities of 100 nodes; 90% of a node's in-edges come from its
own community, as in graphs with strong clustering), each with node ids shuffled (the
"random order"), then renumbered by :func:`commgnn.partition.reorder.locality_order`.

    python benchmarks/aggregation_kernels.py
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import Tensor
from torch_geometric.nn import MessagePassing
from torch_geometric.utils import softmax

from commgnn import kernels
from commgnn.kernels.jit import njit, prange
from commgnn.models.graph import CSRPair, csr_product
from commgnn.partition.reorder import locality_order
from tables import write_table

RESULTS = Path(__file__).parent / "results" / "kernels"


class SumConv(MessagePassing):
    """``out_i = sum_{j -> i} w_ji x_j`` through PyG's generic gather/scatter path."""

    def __init__(self) -> None:
        super().__init__(aggr="add")

    def forward(self, x: Tensor, edge_index: Tensor, w: Tensor) -> Tensor:
        return self.propagate(edge_index, x=x, w=w)

    def message(self, x_j: Tensor, w: Tensor) -> Tensor:  # type: ignore[override]
        return w.view(-1, 1) * x_j


@njit(parallel=True, cache=True)
def _triad(a: np.ndarray, b: np.ndarray, c: np.ndarray, s: float) -> None:  # pragma: no cover
    for i in prange(a.shape[0]):
        a[i] = b[i] + s * c[i]


def stream_triad(n: int = 20_000_000) -> dict[str, float]:
    """Best-of-10 triad bandwidth in GB/s (24 bytes per element: read b, c; write a)."""
    a, b, c = (torch.rand(n, dtype=torch.float64) for _ in range(3))
    out = {}
    for name, fn in (("torch", lambda: torch.add(b, c, alpha=3.0, out=a)),
                     ("numba", lambda: _triad(a.numpy(), b.numpy(), c.numpy(), 3.0))):
        fn()
        best = min(_timed(fn) for _ in range(10))
        out[name] = 24 * n / best / 1e9
    return out


def _timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _median(fn: Callable[[], object], reps: int) -> float:
    fn()  # warm-up: compilation, page faults of the first output
    return statistics.median(_timed(fn) for _ in range(reps))


def make_graph(kind: str, n: int, e: int, seed: int) -> Tensor:
    """``[2, E]`` (source, target) edges with shuffled ids."""
    g = torch.Generator().manual_seed(seed)
    dst = torch.randint(0, n, (e,), generator=g)
    if kind == "uniform":
        src = torch.randint(0, n, (e,), generator=g)
    else:
        size = 100
        local = torch.rand(e, generator=g) < 0.9
        src = torch.randint(0, n, (e,), generator=g)
        base = (dst // size) * size
        src[local] = (base + torch.randint(0, size, (e,), generator=g))[local].clamp_(max=n - 1)
    perm = torch.randperm(n, generator=g)  # the ids a loader hands over: no locality left
    return perm[torch.stack([src, dst])]


def relabel(edge_index: Tensor, order: Tensor) -> Tensor:
    """New id of old node ``order[i]`` is ``i``."""
    new = torch.empty_like(order)
    new[order] = torch.arange(order.numel())
    return new[edge_index]


def gcn_weights(edge_index: Tensor, n: int) -> Tensor:
    deg = torch.bincount(edge_index[1], minlength=n).clamp(min=1).double()
    dinv = deg.pow(-0.5)
    return (dinv[edge_index[0]] * dinv[edge_index[1]]).float()


def spmm_rows(edge_index: Tensor, n: int, f: int, reps: int, stream: float, with_pyg: bool) -> list[dict]:
    w = gcn_weights(edge_index, n)
    src, dst = edge_index
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, f, generator=g)
    grad = torch.randn(n, f, generator=g)
    pair = CSRPair.build(dst, src, w, (n, n))
    nbytes = src.numel() * (4 * f + 12)
    ref_f = torch.sparse.mm(pair.a, x, reduce="sum")
    ref_b = torch.sparse.mm(pair.at, grad, reduce="sum")
    runs: dict[str, tuple[float, float, float]] = {}
    buf_f, buf_b = torch.empty(n, f), torch.empty(n, f)
    a, at = pair.a, pair.at
    nb = kernels.csr_spmm
    runs["commgnn numba"] = (
        _median(lambda: nb(a.crow_indices(), a.col_indices(), a.values(), x, n, buf_f), reps),
        _median(lambda: nb(at.crow_indices(), at.col_indices(), at.values(), grad, n, buf_b), reps),
        max((csr_product(a, x, "numba") - ref_f).abs().max().item(), (csr_product(at, grad, "numba") - ref_b).abs().max().item()))
    runs["torch CSR sparse.mm"] = (_median(lambda: torch.sparse.mm(a, x, reduce="sum"), reps),
                                   _median(lambda: torch.sparse.mm(at, grad, reduce="sum"), reps), 0.0)
    if with_pyg:
        conv = SumConv()
        xr = x.clone().requires_grad_(True)
        out = conv(xr, edge_index, w)
        err = (out.detach() - ref_f).abs().max().item()
        fwd = _median(lambda: conv(xr, edge_index, w), max(3, reps // 2))

        def backward() -> None:
            y = conv(xr, edge_index, w)
            t = time.perf_counter()
            y.backward(grad)
            backward.t.append(time.perf_counter() - t)  # type: ignore[attr-defined]
        backward.t = []  # type: ignore[attr-defined]
        for _ in range(max(3, reps // 2) + 1):
            xr.grad = None
            backward()
        err = max(err, (xr.grad - ref_b).abs().max().item())
        runs["PyG MessagePassing"] = (fwd, statistics.median(backward.t[1:]), err)  # type: ignore[attr-defined]
    pyg = runs.get("PyG MessagePassing")
    rows = []
    for name, (tf, tb, err) in runs.items():
        for pas, t in (("forward", tf), ("backward", tb)):
            gbs = nbytes / t / 1e9
            rows.append({"kernel": name, "pass": pas, "ms": round(1e3 * t, 1), "GB/s": round(gbs, 2),
                         "% of STREAM": round(100 * gbs / stream, 1),
                         "x PyG MP": round((pyg[0] if pas == "forward" else pyg[1]) / t, 2) if pyg else "",
                         "max abs err vs torch": f"{err:.1e}"})
    return rows


def gat_rows(edge_index: Tensor, n: int, heads: int, chan: int, reps: int) -> list[dict]:
    own = torch.arange(n)
    loops = torch.cat([edge_index, torch.stack([own, own])], 1)
    ag = kernels.AttentionGraph.build(loops, n, n)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(n, heads, chan, generator=g).requires_grad_(True)
    s = torch.randn(n, heads, generator=g).requires_grad_(True)
    d = torch.randn(n, heads, generator=g).requires_grad_(True)
    grad = torch.randn(n, heads, chan, generator=g)
    src, dst = loops

    def torch_path() -> Tensor:
        e = torch.nn.functional.leaky_relu(s[src] + d[dst], 0.2)
        alpha = softmax(e, dst, num_nodes=n)
        out = x.new_zeros(n, heads, chan)
        return out.index_add_(0, dst, x[src] * alpha.unsqueeze(-1))

    fns = {"commgnn numba (fused)": lambda: kernels.gat_attend(x, s, d, ag), "torch / PyG softmax": torch_path}
    results = {}
    for name, fn in fns.items():
        fwd = _median(lambda: fn(), reps)
        times = []
        for _ in range(reps + 1):
            y = fn()
            t = time.perf_counter()
            gs = torch.autograd.grad(y, (x, s, d), grad)
            times.append(time.perf_counter() - t)
        results[name] = (fwd, statistics.median(times[1:]), y.detach(), gs)
    ref = results["torch / PyG softmax"]
    rows = []
    for name, (tf, tb, y, gs) in results.items():
        err = max([(y - ref[2]).abs().max().item()] + [(a - b).abs().max().item() for a, b in zip(gs, ref[3])])
        for pas, t, r in (("forward", tf, ref[0]), ("backward", tb, ref[1])):
            rows.append({"kernel": f"GAT {heads}x{chan}: {name}", "pass": pas, "ms": round(1e3 * t, 1),
                         "x torch path": round(r / t, 2), "max abs err vs torch": f"{err:.1e}"})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=200_000)
    ap.add_argument("--edges", type=int, default=4_000_000)
    ap.add_argument("--features", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--orders", nargs="+", default=["random", "degree", "rcm", "metis"])
    ap.add_argument("--stem", default=None, help="output file stem (default: dated)")
    ns = ap.parse_args()
    torch.set_num_threads(ns.threads)
    kernels.set_threads(ns.threads)
    if not kernels.available():
        raise SystemExit("numba is not installed: pip install 'commgnn[kernels]'")
    n, e, f = ns.nodes, ns.edges, ns.features
    stream = stream_triad()
    yard = max(stream.values())
    rows, gat, notes = [], [], []
    for kind in ("uniform", "community"):
        base = make_graph(kind, n, e, seed=0)
        for order in (["random", "rcm"] if kind == "uniform" else ns.orders):
            t0 = time.perf_counter()
            ei = base if order == "random" else relabel(base, locality_order(base, n, order))
            span = (ei[0] - ei[1]).abs().float().median().item()
            notes.append(f"{kind} / {order}: ordering took {time.perf_counter() - t0:.1f} s; median |src - dst| "
                         f"id distance of an edge {span:,.0f}.")
            for r in spmm_rows(ei, n, f, ns.reps, yard, with_pyg=order in ("random", "rcm")):
                rows.append({"graph": kind, "order": order, **r})
            if kind == "community" and order in ("random", "rcm"):
                for r in gat_rows(ei, n, 8, f // 8, max(3, ns.reps // 2)):
                    gat.append({"graph": kind, "order": order, **r})
            print(rows[-1], flush=True)
    date = datetime.date.today().isoformat()
    stem = RESULTS / (ns.stem or f"{date}-aggregation-kernels")
    head = [f"Shape: N = {n:,}, E = {e:,}, F = {f}, {ns.threads} threads; median of {ns.reps} "
            f"(PyG: of {max(3, ns.reps // 2)}). Effective bytes = E (4F + 12) per pass.",
            f"STREAM triad on this machine in the same run: torch {stream['torch']:.1f} GB/s, numba "
            f"{stream['numba']:.1f} GB/s; {yard:.1f} GB/s is the 100% mark."] + notes
    write_table(rows, stem, "Aggregation kernels: SpMM forward and backward", head)
    write_table(gat, stem.with_name(stem.name + "-gat"), "Aggregation kernels: GAT attention (SDDMM + softmax "
                "+ SpMM), fused against the torch path", head[:1])
    print(f"wrote {stem}.md")


if __name__ == "__main__":
    main()
