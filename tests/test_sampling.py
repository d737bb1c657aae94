"""Neighbour sampling and Cluster-GCN batches on small random graphs (fast)."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from commgnn.sampling.base import MiniBatch
from commgnn.sampling.cluster import ClusterSampler
from commgnn.sampling.csr import CSRTopology
from commgnn.sampling.neighbor import NeighborSampler, replicated_source, sample_neighbors

N = 300
ISOLATED = 20  # the last ISOLATED nodes have no edges
HUB_DEGREE = 120  # node 0 is linked to nodes 1..HUB_DEGREE


def random_graph(seed: int, num_nodes: int = N, num_edges: int = 900) -> Tensor:
    """``[2, E]`` undirected (both directions), coalesced, self-loop-free random graph with a
    hub at node 0 and ``ISOLATED`` edgeless nodes at the end."""
    g = torch.Generator().manual_seed(seed)
    live = num_nodes - ISOLATED
    src = torch.randint(0, live, (num_edges,), generator=g)
    dst = torch.randint(0, live, (num_edges,), generator=g)
    hub = torch.arange(1, HUB_DEGREE + 1)
    src = torch.cat([src, torch.zeros_like(hub)])
    dst = torch.cat([dst, hub])
    keep = src != dst
    src, dst = src[keep], dst[keep]
    keys = torch.unique(torch.cat([src * num_nodes + dst, dst * num_nodes + src]))
    return torch.stack([keys // num_nodes, keys % num_nodes])


@pytest.fixture(scope="module")
def graph() -> tuple[Tensor, CSRTopology]:
    ei = random_graph(0)
    return ei, CSRTopology.from_edge_index(ei, N)


def edge_keys(src: Tensor, dst: Tensor) -> Tensor:
    return src.to(torch.int64) * N + dst.to(torch.int64)


def check_batch(batch: MiniBatch, edge_index: Tensor, seeds: Tensor) -> None:
    """Structure every neighbour-sampled batch must have."""
    graph_keys = edge_keys(edge_index[0], edge_index[1])
    nodes = batch.nodes
    assert nodes.dtype == torch.int64
    assert torch.unique(nodes).numel() == nodes.numel()
    assert batch.blocks[0].num_src == nodes.numel()
    for lower, upper in zip(batch.blocks[:-1], batch.blocks[1:]):
        assert upper.num_src == lower.num_dst
    for block in batch.blocks:
        src, dst = block.edge_index
        assert block.num_dst <= block.num_src
        assert bool((src >= 0).all() and (src < block.num_src).all())
        assert bool((dst >= 0).all() and (dst < block.num_dst).all())
        assert bool((dst[1:] >= dst[:-1]).all()), "edges sorted by destination"
        assert bool(torch.isin(edge_keys(nodes[src], nodes[dst]), graph_keys).all())
        # The rows beyond the destinations are exactly the newly reached sources.
        extra = torch.arange(block.num_dst, block.num_src)
        assert bool(torch.isin(extra, src).all())
        assert block.weight.dtype == torch.float64 and block.weight.numel() == src.numel()
    # Seeds are the first rows at every depth, in order, and the targets.
    assert torch.equal(nodes[: seeds.numel()], seeds)
    assert batch.blocks[-1].num_dst == seeds.numel()
    assert torch.equal(batch.target, torch.arange(seeds.numel()))
    assert batch.target_weight is None


def check_weights(edge_index: Tensor, weight: Tensor, num_dst: int) -> None:
    """Each destination's weights sum to 1 where it has in-edges, 0 elsewhere."""
    total = torch.zeros(num_dst, dtype=torch.float64).index_add_(0, edge_index[1], weight)
    has = torch.bincount(edge_index[1], minlength=num_dst) > 0
    assert torch.allclose(total[has], torch.ones(int(has.sum()), dtype=torch.float64))
    assert bool((total[~has] == 0).all())


# -------------------------------------------------------------------- sample_neighbors


@pytest.mark.parametrize("fanout", [0, 1, 4, 15, 200])
def test_fanout_bounds_without_replacement(graph, fanout):
    ei, csr = graph
    nodes = torch.randperm(N, generator=torch.Generator().manual_seed(fanout))
    src, pos = sample_neighbors(csr, nodes, fanout, torch.Generator().manual_seed(1))
    assert src.dtype == torch.int64 and pos.dtype == torch.int64
    assert bool((pos[1:] >= pos[:-1]).all())
    deg = csr.in_degree()[nodes]
    assert torch.equal(torch.bincount(pos, minlength=N), torch.clamp(deg, max=fanout))
    assert bool(torch.isin(edge_keys(src, nodes[pos]), edge_keys(ei[0], ei[1])).all())
    # The graph has no multi-edges, so distinct slots are distinct (src, dst) pairs.
    assert torch.unique(edge_keys(src, nodes[pos])).numel() == src.numel()


@pytest.mark.parametrize("fanout", [1, 7])
def test_fanout_with_replacement(graph, fanout):
    ei, csr = graph
    nodes = torch.arange(N)
    src, pos = sample_neighbors(csr, nodes, fanout, torch.Generator().manual_seed(2), replace=True)
    deg = csr.in_degree()
    assert torch.equal(torch.bincount(pos, minlength=N), torch.where(deg > 0, fanout, 0))
    assert bool((torch.bincount(pos, minlength=N)[N - ISOLATED:] == 0).all())
    assert bool(torch.isin(edge_keys(src, nodes[pos]), edge_keys(ei[0], ei[1])).all())
    assert bool((pos[1:] >= pos[:-1]).all())


def test_fanout_all(graph):
    ei, csr = graph
    nodes = torch.tensor([0, 5, N - 1, 17, 5])
    src, pos = sample_neighbors(csr, nodes, -1, torch.Generator().manual_seed(0))
    got = torch.sort(edge_keys(src, nodes[pos])).values
    want_mask = torch.isin(ei[1], nodes)
    mult = torch.bincount(nodes, minlength=N)  # node 5 twice: its edges twice
    want = edge_keys(ei[0], ei[1])[want_mask].repeat_interleave(mult[ei[1][want_mask]])
    assert torch.equal(got, torch.sort(want).values)


@pytest.mark.parametrize("replace", [False, True])
def test_sampling_is_uniform(graph, replace):
    _, csr = graph
    draws, fanout = 3000, 12
    hub = torch.zeros(draws, dtype=torch.int64)  # node 0, sampled `draws` times in one call
    src, pos = sample_neighbors(csr, hub, fanout, torch.Generator().manual_seed(3), replace=replace)
    assert src.numel() == draws * fanout
    if not replace:  # distinct within every draw
        assert torch.unique(pos * N + src).numel() == src.numel()
    neighbours = csr.indices[csr.indptr[0]:csr.indptr[1]].to(torch.int64)
    freq = torch.bincount(src, minlength=N)[neighbours].to(torch.float64) / draws
    expected = fanout / neighbours.numel()
    assert bool(((freq - expected).abs() < 0.3 * expected).all()), (freq.min(), freq.max(), expected)


def test_every_subset_of_a_node_is_equally_likely():
    """Floyd's draw keeps each of the C(5, 2) = 10 pairs of a degree-5 node with probability
    1/10 (a per-neighbour check alone would pass a sampler biased between pairs)."""
    ei = torch.tensor([[1, 2, 3, 4, 5], [0, 0, 0, 0, 0]])
    csr = CSRTopology.from_edge_index(ei, 6)
    draws = 20000
    src, pos = sample_neighbors(csr, torch.zeros(draws, dtype=torch.int64), 2, torch.Generator().manual_seed(7))
    pairs = torch.sort(src.view(draws, 2), 1).values
    assert bool((pairs[:, 0] < pairs[:, 1]).all())  # distinct within a draw
    freq = torch.bincount(pairs[:, 0] * 6 + pairs[:, 1], minlength=36).to(torch.float64) / draws
    seen = freq[freq > 0]
    assert seen.numel() == 10
    assert bool(((seen - 0.1).abs() < 0.012).all()), seen  # 5.6 standard deviations of 1/10


def test_a_hub_of_a_million_edges_gives_fanout_distinct_slots():
    """A node of a million in-edges, drawn three times in one call: ``fanout`` distinct slots
    each time, grouped by position."""
    deg = 1_000_000
    indptr = torch.tensor([0, deg])
    indices = torch.arange(deg, dtype=torch.int64)
    src, pos = sample_neighbors(CSRTopology(indptr=indptr, indices=indices), torch.zeros(3, dtype=torch.int64), 5,
                                torch.Generator().manual_seed(0))
    assert src.numel() == 15 and torch.equal(pos, torch.arange(3).repeat_interleave(5))
    assert all(torch.unique(src[i * 5:(i + 1) * 5]).numel() == 5 for i in range(3))


# ------------------------------------------------------------------- NeighborSampler


def make_sampler(csr: CSRTopology, seeds: Tensor, fanouts=(5, 3), batch_size=32, replace=False):
    return NeighborSampler(replicated_source(csr, replace), seeds, list(fanouts), batch_size)


@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("fanouts", [(5, 3), (2, 2, 2), (-1,)])
def test_batches_are_valid(graph, replace, fanouts):
    ei, csr = graph
    seeds = torch.randperm(N, generator=torch.Generator().manual_seed(4))[:100]
    sampler = make_sampler(csr, seeds, fanouts, 24, replace)
    assert sampler.num_layers == len(fanouts)
    batches = list(sampler.epoch(sampler.num_batches(), torch.Generator().manual_seed(5)))
    assert len(batches) == 5
    for batch in batches:
        chunk = batch.output_nodes
        check_batch(batch, ei, chunk)
        for block in batch.blocks:
            check_weights(block.edge_index, block.weight, block.num_dst)
        # Fan-out bound at every hop (hop 1 is the last block).
        deg = csr.in_degree()
        for fanout, block in zip(fanouts, reversed(batch.blocks)):
            got = torch.bincount(block.edge_index[1], minlength=block.num_dst)
            d = deg[batch.nodes[: block.num_dst]]
            if fanout < 0:
                want = d
            elif replace:
                want = torch.where(d > 0, fanout, 0)
            else:
                want = torch.clamp(d, max=fanout)
            assert torch.equal(got, want)


def test_seed_fixes_the_sample(graph):
    _, csr = graph
    seeds = torch.arange(0, N, 3)
    sampler = make_sampler(csr, seeds, (6, 4), 40)

    def run(seed: int) -> list[MiniBatch]:
        return list(sampler.epoch(3, torch.Generator().manual_seed(seed)))

    def same(a: list[MiniBatch], b: list[MiniBatch]) -> bool:
        return all(torch.equal(x.nodes, y.nodes) and all(
            torch.equal(p.edge_index, q.edge_index) for p, q in zip(x.blocks, y.blocks))
            for x, y in zip(a, b))

    assert same(run(7), run(7))
    assert not same(run(7), run(8))
    # sample() alone is repeatable too (the fan-out draw, not just the seed order).
    s1 = sampler.sample(seeds[:50], torch.Generator().manual_seed(9))
    s2 = sampler.sample(seeds[:50], torch.Generator().manual_seed(9))
    s3 = sampler.sample(seeds[:50], torch.Generator().manual_seed(10))
    assert same([s1], [s2]) and not same([s1], [s3])


class CountingSource:
    """Wraps a source and counts its calls (a distributed source's collectives)."""

    def __init__(self, csr: CSRTopology) -> None:
        self.inner = replicated_source(csr, False)
        self.calls = 0

    def __call__(self, nodes: Tensor, fanout: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        self.calls += 1
        return self.inner(nodes, fanout, generator)


@pytest.mark.parametrize("num_seeds", [0, 1, 37, 100])
def test_epoch_covers_every_seed_once(graph, num_seeds):
    ei, csr = graph
    seeds = torch.randperm(N, generator=torch.Generator().manual_seed(num_seeds))[:num_seeds]
    source = CountingSource(csr)
    sampler = NeighborSampler(source, seeds, [4, 4, 2], batch_size=16)
    nb = sampler.num_batches()
    assert nb == -(-num_seeds // 16)
    for steps in sorted({1, max(nb - 1, 1), max(nb, 1), nb + 3}):
        source.calls = 0
        batches = list(sampler.epoch(steps, torch.Generator().manual_seed(steps)))
        assert len(batches) == steps
        assert source.calls == steps * sampler.num_layers
        covered = torch.cat([b.nodes[b.target] for b in batches])
        assert torch.equal(torch.sort(covered).values, torch.sort(seeds).values)
        for batch in batches:
            check_batch(batch, ei, batch.output_nodes)


def test_empty_batch_still_calls_the_source(graph):
    _, csr = graph
    source = CountingSource(csr)
    sampler = NeighborSampler(source, torch.arange(10), [3, 2], batch_size=4)
    batch = sampler.sample(torch.zeros(0, dtype=torch.int64), torch.Generator().manual_seed(0))
    assert source.calls == 2
    assert batch.nodes.numel() == 0 and batch.target.numel() == 0
    assert [(b.num_src, b.num_dst, b.num_edges) for b in batch.blocks] == [(0, 0, 0), (0, 0, 0)]
    assert NeighborSampler(source, torch.zeros(0, dtype=torch.int64), [3], 4).num_batches() == 0


# -------------------------------------------------------------------- ClusterSampler


def induced_keys(edge_index: Tensor, nodes: Tensor) -> Tensor:
    """Sorted global keys of the graph's edges with both ends in ``nodes`` (the naive way)."""
    inside = set(nodes.tolist())
    keys = [s * N + d for s, d in edge_index.t().tolist() if s in inside and d in inside]
    return torch.sort(torch.tensor(keys, dtype=torch.int64)).values


def own_setup(seed: int, n: int) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    own = torch.sort(torch.randperm(N, generator=g)[:n]).values
    train = torch.rand(n, generator=g) < 0.4
    return own, train


@pytest.mark.parametrize("num_clusters,per_batch", [(12, 3), (5, 2), (1, 1), (500, 40)])
def test_cluster_batches(graph, num_clusters, per_batch):
    ei, csr = graph
    own, train = own_setup(num_clusters, 200)
    sampler = ClusterSampler(csr, own, train, num_layers=2, num_clusters=num_clusters,
                             clusters_per_batch=per_batch, seed=0)
    k = min(num_clusters, own.numel())
    assert sampler.num_clusters == k
    assert sampler.num_batches() == -(-k // per_batch)
    assert sampler.num_layers == 2
    nb = sampler.num_batches()
    cross_cluster_edges = 0
    for steps in sorted({1, max(nb - 1, 1), nb, nb + 2}):
        batches = list(sampler.epoch(steps, torch.Generator().manual_seed(steps)))
        assert len(batches) == steps
        all_nodes = torch.cat([b.nodes for b in batches])
        assert torch.equal(torch.sort(all_nodes).values, own), "every own node exactly once"
        targets = torch.cat([b.nodes[b.target] for b in batches])
        assert torch.equal(torch.sort(targets).values, own[train])
        for batch in batches:
            b = batch.nodes.numel()
            assert len(batch.blocks) == 2
            assert bool((batch.nodes[1:] > batch.nodes[:-1]).all())
            local = torch.searchsorted(own, batch.nodes)
            assert torch.equal(batch.target, train[local].nonzero().flatten())
            for block in batch.blocks:
                assert block.num_src == block.num_dst == b
                assert torch.equal(block.edge_index, batch.blocks[0].edge_index)
                src, dst = block.edge_index
                assert bool((dst[1:] >= dst[:-1]).all())
                check_weights(block.edge_index, block.weight, b)
            src, dst = batch.blocks[0].edge_index
            got = torch.sort(edge_keys(batch.nodes[src], batch.nodes[dst])).values
            assert torch.equal(got, induced_keys(ei, batch.nodes))
            cl = sampler.cluster[local]
            cross_cluster_edges += int((cl[src] != cl[dst]).sum())
    if per_batch > 1 and k > 1:
        assert cross_cluster_edges > 0, "edges between merged clusters are kept"


def test_cluster_is_metis_and_seeded(graph):
    ei, csr = graph
    own, train = own_setup(1, 250)

    def make(seed: int) -> ClusterSampler:
        return ClusterSampler(csr, own, train, num_layers=1, num_clusters=6, clusters_per_batch=2, seed=seed)

    a, b = make(3), make(3)
    assert torch.equal(a.cluster, b.cluster)
    assert int(a.cluster.min()) >= 0 and int(a.cluster.max()) < 6
    # METIS clusters cut fewer internal edges than contiguous chunks of the id range.
    src, pos = csr.neighbours_of(own)
    idx = torch.searchsorted(own, src).clamp(max=own.numel() - 1)
    inside = own[idx] == src
    s, d = idx[inside], pos[inside]
    metis_cut = int((a.cluster[s] != a.cluster[d]).sum())
    chunks = torch.arange(own.numel()) * 6 // own.numel()
    assert metis_cut < int((chunks[s] != chunks[d]).sum())


def test_cluster_more_clusters_than_nodes_and_empty_rank(graph):
    ei, csr = graph
    own, train = own_setup(2, 15)
    sampler = ClusterSampler(csr, own, train, num_layers=3, num_clusters=50, clusters_per_batch=4, seed=0)
    assert sampler.num_clusters == 15 and sampler.num_batches() == 4
    batches = list(sampler.epoch(6, torch.Generator().manual_seed(0)))
    assert len(batches) == 6
    assert torch.equal(torch.sort(torch.cat([x.nodes for x in batches])).values, own)
    empty = ClusterSampler(csr, torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.bool),
                           num_layers=2, num_clusters=4, clusters_per_batch=2, seed=0)
    assert empty.num_batches() == 0
    batches = list(empty.epoch(3, torch.Generator().manual_seed(0)))
    assert len(batches) == 3 and all(x.nodes.numel() == 0 and len(x.blocks) == 2 for x in batches)
    # Isolated own nodes only: no internal edges, contiguous clusters, no edges in batches.
    lonely = torch.arange(N - ISOLATED, N)
    s = ClusterSampler(csr, lonely, torch.ones(ISOLATED, dtype=torch.bool), num_layers=1,
                       num_clusters=4, clusters_per_batch=1, seed=0)
    batches = list(s.epoch(s.num_batches(), torch.Generator().manual_seed(0)))
    assert all(x.blocks[0].num_edges == 0 for x in batches)
    assert torch.equal(torch.sort(torch.cat([x.nodes[x.target] for x in batches])).values, lonely)


@pytest.mark.parametrize("chunk", [1, 7, 1 << 22])
def test_csr_from_local_rows_equals_from_pairs(chunk: int) -> None:
    """A rank's own CSR built chunk by chunk from its local in-CSR (the folder's arrays)
    equals the one sorted from its global (source, target) pairs, dtype included."""
    gen = torch.Generator().manual_seed(0)
    n_own, n_halo, E = 50, 30, 600
    ids = torch.randperm(1000, generator=gen)[: n_own + n_halo]  # global id of each local row
    dst = torch.sort(torch.randint(0, n_own, (E,), generator=gen)).values
    dst[:5] = 0  # a heavy first row, and (below) rows without in-edges
    dst[dst == 7] = 8
    src = torch.randint(0, n_own + n_halo, (E,), generator=gen)
    key = dst * (n_own + n_halo) + src  # the local CSR: targets, then local sources ascending
    order = torch.sort(key).indices
    src, dst = src[order], dst[order]
    indptr = torch.zeros(n_own + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(dst, minlength=n_own), 0, out=indptr[1:])
    ref = CSRTopology.from_pairs(ids[src], dst, n_own)
    got = CSRTopology.from_local_csr(indptr, src.to(torch.int32), ids, chunk_edges=chunk)
    assert torch.equal(got.indptr, ref.indptr)
    assert got.indices.dtype == ref.indices.dtype and torch.equal(got.indices, ref.indices)
