"""The mini-batch memory estimate: its per-step sizes bound what the real samplers draw, and
its terms (topology, cache, evaluation, VR-GCN's history) enter as documented (fast)."""

from __future__ import annotations

import pytest
import torch

from commgnn.runner import preflight as pf
from commgnn.sampling.cluster import ClusterSampler
from commgnn.sampling.csr import CSRTopology
from commgnn.sampling.neighbor import NeighborSampler, replicated_source
from commgnn.sampling.saint import SaintSampler
from commgnn.sampling.vrgcn import VRGCNSampler

N, E_UNDIRECTED = 2000, 12000


def random_csr(n: int, undirected_edges: int, seed: int = 0) -> tuple[CSRTopology, int]:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n, (undirected_edges,), generator=g)
    dst = torch.randint(0, n, (undirected_edges,), generator=g)
    keep = src != dst
    keys = torch.unique(torch.cat([src[keep] * n + dst[keep], dst[keep] * n + src[keep]]))
    ei = torch.stack([keys // n, keys % n])
    return CSRTopology.from_edge_index(ei, n), int(ei.shape[1])


@pytest.fixture(scope="module")
def csr() -> tuple[CSRTopology, int]:
    return random_csr(N, E_UNDIRECTED)


@pytest.fixture(scope="module")
def big() -> tuple[CSRTopology, int]:
    """100k nodes, average degree ~10: batches far from covering the graph."""
    return random_csr(100_000, 500_000, seed=1)


def check_neighbor(topo: CSRTopology, E: int, n: int, fanout: tuple[int, ...], batch: int, replace: bool,
                   tight: float) -> None:
    seeds = torch.randperm(n, generator=torch.Generator().manual_seed(1))[:4 * batch]
    sampler = NeighborSampler(replicated_source(topo, replace), seeds, list(fanout), batch)
    st = pf.sampled_per_step(sampler="neighbor", batch_size=batch, fanout=fanout, layers=len(fanout),
                             num_nodes=n, num_edges=E, own_nodes=4 * batch)
    assert len(st.outs) == len(fanout)
    most = 0
    for mb in sampler.epoch(sampler.num_batches(), torch.Generator().manual_seed(2)):
        assert mb.nodes.numel() <= st.nodes
        assert all(b.num_dst <= o for b, o in zip(mb.blocks, st.outs))  # blocks[0] is layer 1
        assert sum(b.num_edges for b in mb.blocks) <= st.edges
        most = max(most, mb.nodes.numel())
    assert most >= tight * st.nodes  # a bound close to what is drawn, not far above it


@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("fanout,batch", [((5, 3), 64), ((2, 2, 2), 100), ((10, 10), 500)])
def test_neighbor_step_sizes_bound_the_sampler(csr, fanout, batch, replace):
    topo, E = csr
    check_neighbor(topo, E, N, fanout, batch, replace, tight=0.3)


@pytest.mark.parametrize("fanout", [(2, 2, 2, 2), (5, 5, 5), (10, 15)])
def test_neighbor_bound_on_a_graph_the_batch_does_not_cover(big, fanout):
    """Every node gathered so far draws at each hop: ``c_k = c_{k-1} (1 + f_k)``, which
    the draws come within 2x of while the graph is much larger than the batch (repeats and
    nodes of degree below the fan-out draw fewer)."""
    topo, E = big
    check_neighbor(topo, E, 100_000, fanout, 128, False, tight=0.5)


def test_vrgcn_step_sizes_bound_the_sampler(big):
    topo, E = big
    seeds = torch.randperm(100_000, generator=torch.Generator().manual_seed(3))[:512]
    fanout = (3, 3, 3)
    sampler = VRGCNSampler(topo, replicated_source(topo, False), seeds, fanout, 128)
    st = pf.sampled_per_step(sampler="vrgcn", batch_size=128, fanout=fanout, layers=3, num_nodes=100_000,
                             num_edges=E, own_nodes=512)
    assert len(st.outs) == 3
    for mb in sampler.epoch(sampler.num_batches(), torch.Generator().manual_seed(4)):
        assert mb.nodes.numel() <= st.nodes
        assert all(b.num_dst <= o for b, o in zip(mb.blocks, st.outs))  # blocks[0]: the identity
        full = [h.src.numel() for h in mb.history_edges if h is not None]
        assert sum(full) <= st.full_edges and max(full) <= st.full_edges_layer
        assert sum(b.num_edges for b in mb.blocks) <= st.edges


@pytest.mark.parametrize("sampler", ["neighbor", "vrgcn", "cluster", "saint-node", "saint-edge", "saint-rw"])
def test_step_sizes_stay_within_the_graph(sampler):
    """Fan-out -1, a batch larger than the graph and a rank without nodes."""
    for own in (0, 50):
        st = pf.sampled_per_step(sampler=sampler, batch_size=10_000, fanout=(-1, 3), layers=2, num_nodes=100,
                                 num_edges=800, own_nodes=own, budget=10_000)
        assert 0 <= st.nodes <= 100 and all(0 <= o <= 100 for o in st.outs) and len(st.outs) == 2
        assert 0 <= st.edges and st.full_edges_layer <= 800


def test_subgraph_samplers_are_bounded(csr):
    topo, E = csr
    own = torch.arange(0, N, 2)
    train = torch.rand(own.numel(), generator=torch.Generator().manual_seed(3)) < 0.5
    cl = ClusterSampler(topo, own, train, num_layers=2, num_clusters=20, clusters_per_batch=3, seed=0)
    st = pf.sampled_per_step(sampler="cluster", batch_size=1, fanout=(1,), layers=2, num_nodes=N,
                             num_edges=E, own_nodes=own.numel(), num_clusters=20, clusters_per_batch=3)
    assert st.outs == (st.nodes, st.nodes)
    sizes = [(mb.nodes.numel(), mb.blocks[0].num_edges)
             for mb in cl.epoch(cl.num_batches(), torch.Generator().manual_seed(4))]
    assert max(n for n, _ in sizes) <= st.nodes and max(n for n, _ in sizes) >= 0.9 * st.nodes
    assert max(e for _, e in sizes) <= st.edges
    for kind, budget in (("node", 150), ("edge", 100), ("rw", 60)):
        s = SaintSampler(topo, own, train, kind=kind, num_layers=2, budget=budget, walk_length=2, presample=5)
        st = pf.sampled_per_step(sampler=f"saint-{kind}", batch_size=1, fanout=(1,), layers=2, num_nodes=N,
                                 num_edges=E, own_nodes=own.numel(), budget=budget, walk_length=2)
        drawn = [(mb.nodes.numel(), mb.blocks[0].num_edges) for mb in s.epoch(4, torch.Generator().manual_seed(5))]
        assert max(n for n, _ in drawn) <= st.nodes, kind
        assert max(e for _, e in drawn) <= st.edges, kind


def test_minibatch_estimate_terms():
    report = {"nodes": [1000, 1000], "halo_in": [3000, 2500], "halo_out": [2500, 3000], "edges": [20000, 20000]}

    def est(**kw):
        args = dict(num_nodes=2000, num_edges=40000, num_features=64, num_classes=5, report=report, layers=2,
                    hidden=128, batch_size=32, fanout=(5, 5), topology="partitioned", available=1e12)
        return pf.estimate_minibatch_memory(**(args | kw)).per_rank

    base = est()
    # A replicated CSR adds the whole graph's edges to every rank.
    rep = est(topology="replicated")
    # (partitioned, neighbour sampling keeps int32 sources and row pointers of its own
    # in-edges; their build is a transient below evaluation's here)
    assert rep[0] - base[0] == pytest.approx(pf.TOPOLOGY_BYTES_PER_EDGE * 40000 + 8 * 2000 - (4 * 20000 + 8 * 1000))
    # A cache of 1 MB holds 1e6 / 256 rows of 64 fp32 features, 16 bytes of bookkeeping each.
    # With a cache the epoch's request trace is kept for its comparisons: 32 steps of up to
    # 32 x 6 x 6 = 1152 sampled rows, 24 bytes each.
    trace = pf.TRACE_BYTES * 32 * 1152
    # (and the arrays over every node a cache adds: its slot map, degrees, request counts)
    assert est(cache_mb=1.0)[0] - base[0] == pytest.approx(1e6 / 256 * (256 + 16) + trace
                                                           + pf.CACHE_NODE_BYTES * 2000)
    assert est(cache_ratio=0.5)[0] - base[0] == pytest.approx(0.5 * 1000 * (256 + 16) + trace
                                                              + pf.CACHE_NODE_BYTES * 2000)
    # Small batches: evaluation over the partition's 4000 rows is the larger transient
    # (halo rows: 16 bytes of ids each, no features; the forward holds them twice at
    # max(F, H) = 128 wide, in the layer's input and the block received).
    assert base[0] - base[1] == pytest.approx(500 * 16 + 500 * 2 * 128 * 4)
    # Layer by layer, evaluation holds owned rows and one chunk: the halo rows add only their ids.
    lw = est(inference="layerwise", inference_chunk=100)
    assert lw[0] - lw[1] == pytest.approx(500 * 16)
    # auto goes layer by layer when the full forward of the 2 ranks crowds half of memory
    assert est(available=1e6, inference_chunk=100) == lw
    # VR-GCN keeps a history of N x H per layer above the first: 128 more columns, 2000 rows.
    assert est(sampler="vrgcn", hidden=256)[0] - est(sampler="vrgcn")[0] >= 2000 * 128 * 4
    # Prefetch keeps a second batch alive.
    assert est(prefetch=True, batch_size=500)[0] > est(batch_size=500)[0]


def test_minibatch_is_estimated_below_full_graph_when_batches_are_small():
    """The case the full-graph model got wrong: a wide, deep model on a partition whose halo
    is large, trained on small batches, holds far less than full-graph training would."""
    report = {"nodes": [250_000] * 4, "halo_in": [500_000] * 4, "halo_out": [500_000] * 4, "edges": [5_000_000] * 4,
              "train_nodes": [25_000] * 4}
    common = dict(num_nodes=1_000_000, num_edges=20_000_000, num_features=64, num_classes=8, report=report,
                  layers=3, hidden=256)
    full = pf.estimate_memory(model="sage", **common)
    mini = pf.estimate_minibatch_memory(fanout=(5, 5, 5), batch_size=256, topology="partitioned", **common)
    assert sum(mini.per_rank) < 0.7 * sum(full.per_rank)


def test_estimate_for_config_follows_the_mode():
    from commgnn.runner.config import RunConfig
    from commgnn.sampling.config import SamplerConfig
    from commgnn.trainers.config import TrainConfig

    graph = {"num_nodes": 2000, "num_edges": 40000, "num_features": 64, "num_classes": 5}
    report = {"nodes": [1000, 1000], "halo_in": [300, 200], "halo_out": [200, 300], "edges": [20000, 20000]}
    from commgnn.models.config import ModelConfig

    model = ModelConfig(name="sage", layers=2)
    full = pf.estimate_for_config(RunConfig(model=model), graph, report)
    mini = pf.estimate_for_config(RunConfig(model=model, train=TrainConfig(mode="minibatch"),
                                            minibatch=SamplerConfig(topology="partitioned", fanout=(5, 5))),
                                  graph, report)
    assert full is not None and mini is not None
    direct = pf.estimate_minibatch_memory(num_nodes=2000, num_edges=40000, num_features=64, num_classes=5,
                                          report=report, layers=2, hidden=model.hidden, fanout=(5, 5),
                                          topology="partitioned", batch_size=1024)
    assert mini.per_rank == pytest.approx(direct.per_rank)
    assert full.per_rank != pytest.approx(mini.per_rank)


def test_the_topology_auto_chooses_is_the_one_estimated(monkeypatch):
    """``topology = auto`` is estimated as the ranks will choose it: a GraphSAINT run whose
    CSR does not fit gets the partitioned estimate (own in-edges, every node's degree and
    list offset, no normalisation over every edge), far below the replicated one."""
    from commgnn.models.config import ModelConfig
    from commgnn.runner.config import RunConfig
    from commgnn.sampling.config import SamplerConfig
    from commgnn.trainers.config import TrainConfig

    N, E = 1_000_000, 20_000_000
    graph = {"num_nodes": N, "num_edges": E, "num_features": 64, "num_classes": 5}
    report = {"nodes": [N // 2] * 2, "halo_in": [30000, 20000], "halo_out": [20000, 30000], "edges": [E // 2] * 2}
    cfg = RunConfig(model=ModelConfig(name="sage", layers=2), train=TrainConfig(mode="minibatch"),
                    minibatch=SamplerConfig(sampler="saint-node", topology="auto"))
    chosen: list[str] = []

    def answer(topology: str):
        def choose(*args, **kwargs):
            chosen.append(topology)
            return topology
        return choose

    per = {}
    for topology in ("replicated", "partitioned"):
        monkeypatch.setattr(pf, "choose_topology", answer(topology))
        est = pf.estimate_for_config(cfg, graph, report)
        direct = pf.estimate_minibatch_memory(num_nodes=N, num_edges=E, num_features=64, num_classes=5,
                                              report=report, layers=2, hidden=cfg.model.hidden, sampler="saint-node",
                                              batch_size=cfg.minibatch.batch_size,
                                              fanout=tuple(cfg.minibatch.fanout), topology=topology)
        assert est is not None and est.per_rank == pytest.approx(direct.per_rank)
        per[topology] = max(est.per_rank)
    assert chosen == ["replicated", "partitioned"]
    # 20M edges: the replicated CSR and the normalisation over every edge, against 10M own
    # in-edges and the edges 50 pre-sampled subgraphs of ~2,000 nodes can meet
    assert per["replicated"] - per["partitioned"] > 0.5 * (4 + pf.SAINT_EDGE_BYTES) * E
