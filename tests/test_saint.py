"""GraphSAINT samplers (commgnn.sampling.saint): induced subgraphs, reach, determinism, and
Monte Carlo checks that the pre-sampled normalisation makes the aggregation and the loss
unbiased (and that leaving it out does not).

The graph is a random undirected graph on 300 nodes (a ring keeps every node connected);
this rank owns a random half of it, as one rank of two would.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor
from torch_geometric.utils import coalesce, remove_self_loops, to_undirected

from commgnn.sampling.base import MiniBatch, Sampler
from commgnn.sampling.csr import CSRTopology
from commgnn.sampling.saint import SaintSampler

N = 300
KINDS = ("node", "edge", "rw")
BUDGET = {"node": 60, "edge": 40, "rw": 15}
MC_DRAWS = 3000


def _graph(seed: int = 0) -> tuple[CSRTopology, Tensor, Tensor]:
    """``(csr, own_nodes, train_mask)``: 300 nodes, ~2k undirected edges with skewed degrees
    (a few hubs), a random half owned, half of those training."""
    g = torch.Generator().manual_seed(seed)
    hubs = torch.randint(0, 10, (300,), generator=g)  # hubs 0..9 make the degree law uneven
    rand = torch.randint(0, N, (2, 700), generator=g)
    ring = torch.stack([torch.arange(N), (torch.arange(N) + 1) % N])
    ei = torch.cat([rand, ring, torch.stack([hubs, torch.randint(0, N, (300,), generator=g)])], 1)
    ei, _ = remove_self_loops(ei)
    ei = coalesce(to_undirected(ei), num_nodes=N)
    own = torch.sort(torch.randperm(N, generator=g)[: N // 2]).values
    train = torch.rand(own.numel(), generator=g) < 0.5
    return CSRTopology.from_edge_index(ei, N), own, train


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Thousands of draws on tiny tensors: intra-op threads only add contention on a busy
    machine (3x slower here), so this module runs single-threaded and restores the count."""
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


@pytest.fixture(scope="module")
def graph() -> tuple[CSRTopology, Tensor, Tensor]:
    return _graph()


def _edges(csr: CSRTopology) -> tuple[Tensor, Tensor]:
    """``(src, dst)`` global ids of every edge, in CSR order."""
    return csr.indices.to(torch.int64), torch.repeat_interleave(torch.arange(csr.num_nodes), csr.in_degree())


def _global(mb: MiniBatch) -> tuple[Tensor, Tensor]:
    """``(src, dst)`` global ids of the batch's edges."""
    ei = mb.blocks[0].edge_index
    return mb.nodes[ei[0]], mb.nodes[ei[1]]


def _sampler(graph: tuple[CSRTopology, Tensor, Tensor], kind: str, **kw: object) -> SaintSampler:
    csr, own, train = graph
    args: dict = dict(kind=kind, num_layers=2, budget=BUDGET[kind], presample=50, seed=0)
    args.update(kw)
    return SaintSampler(csr, own, train, **args)


@pytest.mark.parametrize("kind", KINDS)
def test_subgraph_is_the_induced_subgraph(graph, kind: str) -> None:
    csr, own, _ = graph
    src_all, dst_all = _edges(csr)
    keys_all = src_all * N + dst_all
    s = _sampler(graph, kind)
    assert isinstance(s, Sampler)
    gen = torch.Generator().manual_seed(1)
    for mb in s.epoch(5, gen):
        nodes = mb.nodes
        assert nodes.numel() > 0 and bool((nodes[1:] > nodes[:-1]).all())  # sorted, unique
        assert len(mb.blocks) == 2
        for b in mb.blocks:
            assert b.num_src == b.num_dst == nodes.numel()
            assert torch.equal(b.edge_index, mb.blocks[0].edge_index)
            assert b.weight.dtype == torch.float64 and b.weight.numel() == b.num_edges
            assert bool((b.edge_index[1][1:] >= b.edge_index[1][:-1]).all())  # sorted by destination
        src, dst = _global(mb)
        keys = src * N + dst
        assert bool(torch.isin(keys, keys_all).all()), "an edge not in the graph"
        inside = torch.isin(src_all, nodes) & torch.isin(dst_all, nodes)
        assert torch.equal(torch.sort(keys).values, torch.sort(keys_all[inside]).values), "not induced"
        # each edge carries the weight estimated for it (CSR order is ascending in dst * N + src)
        eid = torch.searchsorted(dst_all * N + src_all, dst * N + src)
        assert torch.equal(mb.blocks[0].weight, s.edge_weight[eid])


def test_reach_edge_and_node_samplers_cross_into_the_neighbourhood(graph) -> None:
    csr, own, _ = graph
    gen = torch.Generator().manual_seed(2)
    edge_nodes = torch.cat([mb.nodes for mb in _sampler(graph, "edge").epoch(10, gen)])
    assert bool((~torch.isin(edge_nodes, own)).any()), "edge sampler never reached another rank's node"
    assert bool(torch.isin(edge_nodes, own).any())
    node_nodes = torch.cat([mb.nodes for mb in _sampler(graph, "node").epoch(10, gen)])
    pool = torch.unique(torch.cat([own, csr.neighbours_of(own)[0]]))
    assert bool(torch.isin(node_nodes, pool).all()), "node sampler drew a node beyond its pool"
    assert bool((~torch.isin(node_nodes, own)).any()), "node sampler never drew a neighbouring rank's node"


@pytest.mark.parametrize("kind", KINDS)
def test_seed_fixes_the_draw(graph, kind: str) -> None:
    s = _sampler(graph, kind)
    a = s.draw(torch.Generator().manual_seed(7))
    b = s.draw(torch.Generator().manual_seed(7))
    c = s.draw(torch.Generator().manual_seed(8))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    # the pre-sampling seed fixes the normalisation, and another seed changes it
    assert torch.equal(_sampler(graph, kind).edge_weight, s.edge_weight)
    assert not torch.equal(_sampler(graph, kind, seed=1).edge_weight, s.edge_weight)
    ma = list(s.epoch(3, torch.Generator().manual_seed(3)))
    mb = list(s.epoch(3, torch.Generator().manual_seed(3)))
    for x, y in zip(ma, mb):
        assert torch.equal(x.nodes, y.nodes) and torch.equal(x.target, y.target)
        assert torch.equal(x.blocks[0].edge_index, y.blocks[0].edge_index)


def test_node_sampler_inclusion_follows_degree(graph) -> None:
    """With replacement, ``P(v in S) = 1 - (1 - q_v)^budget`` where ``q_v ∝ deg_v + 1``."""
    csr, own, _ = graph
    s = _sampler(graph, "node", presample=2000)
    pool = torch.unique(torch.cat([own, csr.neighbours_of(own)[0]]))
    q = (csr.in_degree()[pool] + 1).double()
    q = q / q.sum()
    expect = 1 - (1 - q) ** BUDGET["node"]
    seen = s.node_count[pool].double() / 2000
    assert (seen - expect).abs().max() < 0.05
    assert int(s.node_count.sum() - s.node_count[pool].sum()) == 0


@pytest.fixture(scope="module")
def monte_carlo(graph) -> dict[str, dict[str, Tensor]]:
    """Per kind: a sampler pre-sampled 2000 times, then 3000 fresh draws accumulated at once:
    the SAINT aggregation and the un-normalised one summed over draws per node, how many draws
    held each node, and each draw's weighted loss."""
    csr, own, train = graph
    g = torch.Generator().manual_seed(11)
    h = torch.rand(N, 4, generator=g, dtype=torch.float64) + 0.5
    loss = torch.rand(N, generator=g, dtype=torch.float64)
    deg = csr.in_degree().double()
    out: dict[str, dict[str, Tensor]] = {}
    for kind in KINDS:
        s = _sampler(graph, kind, presample=2000, seed=3)
        gen = torch.Generator().manual_seed(4)
        srcs, dsts, ws, nodes, losses = [], [], [], [], []
        for mb in s.epoch(MC_DRAWS, gen):
            src, dst = _global(mb)
            srcs.append(src), dsts.append(dst), ws.append(mb.blocks[0].weight), nodes.append(mb.nodes)
            losses.append((loss[mb.nodes[mb.target]] * mb.target_weight).sum())
        src, dst, w = torch.cat(srcs), torch.cat(dsts), torch.cat(ws)
        # a node's aggregation is 0 in a draw without it, so summing over all draws sums over those holding it
        out[kind] = dict(
            h=h, loss=loss, node_prob=s.node_prob,
            count=torch.bincount(torch.cat(nodes), minlength=N).double(),
            agg=torch.zeros(N, 4, dtype=torch.float64).index_add_(0, dst, w[:, None] * h[src]),
            raw=torch.zeros(N, 4, dtype=torch.float64).index_add_(0, dst, (1 / deg[dst])[:, None] * h[src]),
            loss_est=torch.stack(losses))
    return out


def _rel_err(est: Tensor, exact: Tensor) -> Tensor:
    return (est - exact).norm(dim=1) / exact.norm(dim=1)


@pytest.mark.parametrize("kind", KINDS)
def test_aggregation_is_unbiased(graph, monte_carlo, kind: str) -> None:
    """Averaged over the draws holding v, ``sum_u w_uv h_u`` approaches the mean over v's
    in-neighbours (for the node sampler: at the own nodes, whose in-neighbours all lie in its
    pool); without the ``C_v / C_e`` factor it does not."""
    csr, own, _ = graph
    mc = monte_carlo[kind]
    src, dst = _edges(csr)
    deg = csr.in_degree().double().clamp(min=1)
    exact = torch.zeros(N, 4, dtype=torch.float64).index_add_(0, dst, mc["h"][src]) / deg[:, None]
    often = (mc["count"] >= 300) & (exact.norm(dim=1) > 0)
    if kind == "node":
        often &= torch.isin(torch.arange(N), own)
    assert int(often.sum()) >= 50, "too few nodes seen often enough to judge"
    per_draw = mc["count"][often][:, None]
    err = _rel_err(mc["agg"][often] / per_draw, exact[often])
    raw_err = _rel_err(mc["raw"][often] / per_draw, exact[often])
    assert float(err.median()) < 0.1, f"{kind}: median relative error {float(err.median()):.3f}"
    assert float(err.quantile(0.9)) < 0.25
    if kind in ("edge", "rw"):
        assert float(raw_err.median()) > 0.3, f"{kind}: un-normalised aggregation looks unbiased"
        assert float(raw_err.median()) > 5 * float(err.median())


@pytest.mark.parametrize("kind", KINDS)
def test_loss_estimator_is_unbiased(graph, monte_carlo, kind: str) -> None:
    """``E[sum_{v in S ∩ train} loss_v / p_v] = sum_{v in train} loss_v``, and ``p_v`` matches
    how often fresh draws hold each own training node."""
    _, own, train = graph
    mc = monte_carlo[kind]
    exact = float(mc["loss"][own[train]].sum())
    est = mc["loss_est"]
    # ~0.3% standard error from the draws plus about as much from p_v's own pre-sampling noise;
    # a flat loss weight (the mean p instead of p_v) misses by well over 3%
    assert float(est.std()) / math.sqrt(MC_DRAWS) < 0.01 * exact
    assert abs(float(est.mean()) - exact) < 0.03 * exact, f"{kind}: {float(est.mean()):.3f} vs {exact:.3f}"
    seen = mc["count"][own[train]] / MC_DRAWS
    assert (seen - mc["node_prob"][own[train]]).abs().max() < 0.07


@pytest.mark.parametrize("kind", KINDS)
def test_epoch_steps_and_targets(graph, kind: str) -> None:
    csr, own, train = graph
    s = _sampler(graph, kind)
    batches = list(s.epoch(7, torch.Generator().manual_seed(5)))
    assert len(batches) == 7
    own_train = own[train]
    for mb in batches:
        tnodes = mb.output_nodes[mb.target]
        assert bool(torch.isin(tnodes, own_train).all()), "a target that is not an own training node"
        assert int(torch.isin(mb.nodes, own_train).sum()) == mb.target.numel(), "an own training node left out"
        assert torch.allclose(mb.target_weight, 1 / s.node_prob[tnodes])
    assert _sampler(graph, kind, steps=4).num_batches() == 4
    assert s.num_batches() == max(1, math.ceil(own.numel() / s.mean_subgraph_size))


def test_rank_without_nodes(graph) -> None:
    csr, _, _ = graph
    for kind in KINDS:
        s = SaintSampler(csr, torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.bool),
                         kind=kind, num_layers=3, budget=10)
        assert s.num_batches() == 0
        batches = list(s.epoch(2, torch.Generator().manual_seed(0)))
        assert len(batches) == 2
        assert all(mb.num_sampled_nodes == 0 and len(mb.blocks) == 3 for mb in batches)


def test_walks_start_anywhere_without_training_nodes(graph) -> None:
    csr, own, _ = graph
    s = SaintSampler(csr, own, torch.zeros_like(own, dtype=torch.bool), kind="rw", num_layers=1, budget=5)
    mb = next(s.epoch(1, torch.Generator().manual_seed(0)))
    assert mb.num_sampled_nodes > 0 and mb.target.numel() == 0


def test_bad_arguments_are_refused(graph) -> None:
    csr, own, train = graph
    with pytest.raises(ValueError, match="kind"):
        SaintSampler(csr, own, train, kind="cluster", num_layers=2, budget=10)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="train_mask"):
        SaintSampler(csr, own, train[:-1], kind="node", num_layers=2, budget=10)
    with pytest.raises(ValueError, match="ascending"):
        SaintSampler(csr, own.flip(0), train, kind="node", num_layers=2, budget=10)
