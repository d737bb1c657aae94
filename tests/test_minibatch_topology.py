"""Mini-batch topologies: owner-side neighbour sampling and whole in-edge lists over a
partitioned topology (against the graph and the replicated CSR), Cluster-GCN alike on both,
and ``topology = auto`` on a CSR too big to replicate."""

from __future__ import annotations

import pytest
import torch

from commgnn.fetch.config import FetchConfig
from commgnn.sampling.config import ClusterConfig, SamplerConfig
from helpers import run_on_ranks, small_graph
import mb_ranks
from mb_ranks import mkdir as _mk, random_parts as _parts, small_cfgs as _cfgs


@pytest.mark.timeout(120)
def test_owner_side_sampling_returns_real_edges_within_the_fanout(tmp_path):
    data = small_graph(n=70, m=400)
    res = run_on_ranks(mb_ranks.remote_sampling, 3, tmp_path, data, _parts(70, 3, 2), 3, 4)
    edges = set(map(tuple, data.edge_index.t().tolist()))
    deg = torch.bincount(data.edge_index[1], minlength=70)
    for r in res:
        assert r[0][1].numel() == 0  # an empty round on every rank still completes
        for nodes, src, pos in r:
            assert all((int(s), int(nodes[p])) in edges for s, p in zip(src, pos))
            counts = torch.bincount(pos, minlength=nodes.numel())
            assert torch.equal(counts, deg[nodes].clamp(max=3))
            for p in range(nodes.numel()):  # without replacement: distinct neighbours
                assert src[pos == p].unique().numel() == counts[p]


@pytest.mark.timeout(120)
def test_whole_in_edge_lists_from_the_owners_equal_the_replicated_csr(tmp_path):
    """VR-GCN's history neighbourhoods on a partitioned topology: three ranks ask the owners
    for the whole in-edge lists of random node sets (an empty set first), and get exactly
    the replicated CSR's lists, in its order, for 16 bytes (a position out, a source id
    back) per in-edge of another rank's node, plus each round's 8-byte counts."""
    from commgnn.sampling.csr import CSRTopology

    data = small_graph(n=70, m=400)
    csr = CSRTopology.from_edge_index(data.edge_index, 70)
    res = run_on_ranks(mb_ranks.remote_in_edges, 3, tmp_path, data, _parts(70, 3, 2), 4)
    for r in res:
        assert torch.equal(r["deg"], csr.in_degree())
        assert r["rounds"][0][1].numel() == 0 and r["remote_edges"] > 0
        for nodes, src, pos in r["rounds"]:
            want_src, want_pos = csr.neighbours_of(nodes)
            assert torch.equal(src, want_src) and torch.equal(pos, want_pos)
    # a rank sends its counts and positions and answers the others' positions: over all ranks,
    # 4 rounds x 3 ranks x 2 peers x an 8-byte count, and 8 + 8 bytes per remote edge
    assert sum(r["bytes"] for r in res) == 4 * 3 * 2 * 8 + 16 * sum(r["remote_edges"] for r in res)


@pytest.mark.parametrize("sampler", ["neighbor", "vrgcn", "cluster", "saint-node", "saint-edge", "saint-rw"])
def test_auto_topology_partitions_a_csr_too_big_to_replicate(sampler):
    from commgnn.trainers.mb_setup import choose_topology

    huge = 10**13  # edges: 40 TB of CSR
    cfg = SamplerConfig(sampler=sampler, fanout=(2, 2))
    assert choose_topology(cfg, 100, 400, 4) == "replicated"
    assert choose_topology(cfg, 100, huge, 4) == "partitioned"
    share = SamplerConfig(sampler=sampler, fanout=(2, 2), topology_share=0.5)
    need = (100 * 8 + 1000 * 4) * 4  # the node pointers and edges of 4 local ranks' CSRs
    assert choose_topology(share, 100, 1000, 4, available=2 * need) == "replicated"
    assert choose_topology(share, 100, 1000, 4, available=2 * need - 1) == "partitioned"


@pytest.mark.timeout(180)
def test_cluster_gcn_trains_alike_on_a_partitioned_topology(tmp_path):
    """Cluster-GCN's clusters and batches are a rank's own nodes, so it needs only their
    in-edges: on a partitioned topology two ranks train bit for bit as on the replicated
    CSR, without the replicated CSR's all-gather and without fetching a row."""
    data = small_graph(n=120, m=500)
    parts = _parts(120, 2, 5)
    model, train = _cfgs()
    runs = {}
    for topology in ("replicated", "partitioned"):
        sampler = SamplerConfig(sampler="cluster", topology=topology,
                                cluster=ClusterConfig(num_clusters=6, clusters_per_batch=2))
        runs[topology] = run_on_ranks(mb_ranks.train_minibatch, 2, _mk(tmp_path / topology), data, parts, model,
                                      train, sampler, FetchConfig(cache_ratio=0.2), 2)
    for rep, part in zip(runs["replicated"], runs["partitioned"]):
        assert rep["steps"] == part["steps"] == 3
        for k, v in rep["state"].items():
            assert torch.equal(part["state"][k], v), k
        # both send the owner map; the replicated CSR's all-gather adds 16 bytes an own in-edge
        assert rep["sent"]["topology"] - part["sent"]["topology"] >= 16 * 500 // 2 * 0.8
        assert part["sent"].get("fetch_rows", 0) == 0 and part["logs"][-1]["remote_requests"] == 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["node", "edge", "rw"])
def test_graphsaint_on_a_partitioned_topology(tmp_path, kind):
    """GraphSAINT over a partitioned topology, on three ranks. The node and edge samplers
    draw from what a rank holds (its pool, its in-edges, every node's degree), so with the
    same seed their
    batches, pre-sampled normalisation included, equal the replicated CSR's exactly; the
    walks step through the owners' streams, so they are checked as GraphSAINT batches:
    the subgraph the visited nodes induce in the graph, every edge weighted
    ``C_v / (C_e deg_v)``, every own training node weighted ``1 / p_v``."""
    data = small_graph(n=90, m=400)
    res = run_on_ranks(mb_ranks.saint_both_topologies, 3, tmp_path, data, _parts(90, 3, 4), kind, 4)
    edges = set(map(tuple, data.edge_index.t().tolist()))
    for r in res:
        for rep, got in zip(r["replicated"], r["partitioned"]):
            nodes, ei, w, target, tw = got
            assert nodes.numel() > 0
            if kind != "rw":
                for a, b in zip(rep, got):
                    assert torch.equal(a, b)
                continue
            src, dst = nodes[ei[0]].tolist(), nodes[ei[1]].tolist()
            inside = {(u, v) for u, v in edges if u in set(nodes.tolist()) and v in set(nodes.tolist())}
            assert set(zip(src, dst)) == inside and len(src) == len(inside)
            assert bool((w > 0).all()) and bool(torch.isfinite(w).all())
            own_train = set(r["own"][data.train_mask[r["own"]]].tolist())
            assert set(nodes[target].tolist()) == own_train & set(nodes.tolist())
            assert torch.allclose(tw, 1.0 / r["partitioned_prob"][nodes[target]])

