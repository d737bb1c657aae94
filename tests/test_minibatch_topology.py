"""Mini-batch topologies: owner-side neighbour sampling and whole in-edge lists over a
partitioned topology (against the graph and the replicated CSR), Cluster-GCN and GraphSAINT
on both, ``topology = auto`` on a CSR too big to replicate, and the fan-outs a partitioned
topology refuses."""

from __future__ import annotations

import pytest
import torch

from commgnn.errors import ConfigError
from commgnn.fetch.config import FetchConfig
from commgnn.sampling.config import ClusterGCNConfig, SamplerConfig
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
    # the node pointers and the build of 4 local ranks' CSRs (32 bytes an edge at its peak),
    # and GraphSAINT's weight and count of every edge (float64 + int32)
    need = (100 * 8 + 1000 * (32 + (12 if sampler.startswith("saint") else 0))) * 4
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
                                cluster=ClusterGCNConfig(num_clusters=6, clusters_per_batch=2))
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
    """GraphSAINT over a partitioned topology, on three ranks, one of which samples from no
    own node (its empty draws and walks still enter every round). The node and edge samplers
    draw from what a rank holds (its pool, its in-edges, every node's degree), so with the
    same seed their batches, pre-sampled normalisation included, equal the replicated CSR's
    exactly. The walks step through the owners' streams, so they are checked as GraphSAINT
    batches: the subgraph the visited nodes induce in the graph, every edge ``u -> v``
    weighted ``max(C_v, 1) / (max(C_e, 1) deg_v)``, every own training node
    ``presample / max(C_v, 1)``. ``C_v`` and ``C_e`` are recounted here from the recorded
    pre-sampling draws and the graph's own edge list (``C_e(u, v)`` = draws holding both
    ends), and the sampler's counts, kept by global edge id, must equal them."""
    data = small_graph(n=90, m=400)
    res = run_on_ranks(mb_ranks.saint_both_topologies, 3, tmp_path, data, _parts(90, 3, 4), kind, 4, 2)
    edges = set(map(tuple, data.edge_index.t().tolist()))
    deg = torch.bincount(data.edge_index[1], minlength=90)
    assert res[2]["partitioned"] and all(b[0].numel() == 0 for b in res[2]["partitioned"])
    # global edge ids: one per edge of the graph, the same on every rank
    edge_of: dict[int, tuple[int, int]] = {}
    for r in res:
        for nodes, *_, src, pos, eid in r["partitioned"]:
            for e, u, v in zip(eid.tolist(), src.tolist(), nodes[pos].tolist()):
                assert edge_of.setdefault(e, (u, v)) == (u, v)
    assert len(set(edge_of.values())) == len(edge_of) and 0 <= min(edge_of) and max(edge_of) < len(edges)
    for r in res[:2]:
        c_v, c_e, c_e_ids, r_deg = r["partitioned_counts"]
        assert torch.equal(r_deg, deg)
        draws = [set(d.tolist()) for d in r["partitioned_presampled"]]
        assert len(draws) == 10
        true_c_v = torch.zeros(90, dtype=torch.int64)
        for d in r["partitioned_presampled"]:
            true_c_v[d] += 1
        assert torch.equal(c_v, true_c_v)

        def true_c_e(u: int, v: int) -> int:
            return sum(u in d and v in d for d in draws)
        met = {(u, v) for u, v in edges if true_c_e(u, v)}
        assert c_e_ids.numel() == len(met) and int(c_e.sum()) == sum(true_c_e(u, v) for u, v in met)
        for e, c in zip(c_e_ids.tolist(), c_e.tolist()):
            if e in edge_of:  # the edges whose global id a batch showed
                assert c == true_c_e(*edge_of[e])
        for rep, got in zip(r["replicated"], r["partitioned"]):
            nodes, ei, w, target, tw, src, pos, eid = got
            assert nodes.numel() > 0
            if kind != "rw":
                for a, b in zip(rep, got[:5]):
                    assert torch.equal(a, b)
                assert torch.equal(c_v, r["replicated_counts"][0])
                continue
            members = set(nodes.tolist())
            batch_edges = list(zip(nodes[ei[0]].tolist(), nodes[ei[1]].tolist()))
            assert set(batch_edges) == {(u, v) for u, v in edges if u in members and v in members}
            assert len(batch_edges) == len(set(batch_edges))
            eid_of = {(int(s), int(nodes[p])): int(e) for s, p, e in zip(src, pos, eid)}
            for (u, v), weight in zip(batch_edges, w.tolist()):
                want = max(int(true_c_v[v]), 1) / (max(true_c_e(u, v), 1) * int(deg[v]))
                assert weight == pytest.approx(want, rel=1e-12)
            own_train = set(r["own"][data.train_mask[r["own"]]].tolist())
            assert set(nodes[target].tolist()) == own_train & members
            assert torch.allclose(tw, 10.0 / c_v[nodes[target]].clamp(min=1).double())


def test_a_partitioned_topology_needs_a_positive_fanout_where_it_samples():
    """Owners sample a fixed number per node, so -1 (all) is refused in one line: in the
    config when ``topology = 'partitioned'`` (VR-GCN's last entry is unused and may be -1),
    and at set-up when ``auto`` partitions a graph too big to replicate."""
    from commgnn.distributed.context import DistContext
    from commgnn.distributed.events import Hooks
    from commgnn.partition import build_local_partition
    from commgnn.trainers.mb_setup import build_sampler

    with pytest.raises(ConfigError, match="needs a positive fan-out per sampled layer"):
        SamplerConfig(sampler="vrgcn", fanout=(-1, 2), topology="partitioned")
    SamplerConfig(sampler="vrgcn", fanout=(2, -1), topology="partitioned")  # the input layer's: unused
    data = small_graph(n=40, m=120)
    part = build_local_partition(data, torch.zeros(40, dtype=torch.long), 1, 0)
    ids = torch.arange(40)
    for sampler, fanout in (("neighbor", (3, -1)), ("vrgcn", (-1, 3))):
        cfg = SamplerConfig(sampler=sampler, fanout=fanout)  # auto: fine until the CSR does not fit
        with pytest.raises(ConfigError, match=r"^minibatch.fanout = .*needs a positive fan-out per sampled layer"):
            build_sampler(cfg, DistContext.single(), Hooks(), part, layers=2, csr=None, owner=ids * 0, row=ids,
                          seed=0)

