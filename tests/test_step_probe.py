"""The sampled probe of a neighbour-sampling step's size (runner/step_probe.py) and the
pre-flight estimate built on it."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch_geometric.data import Data

from commgnn.errors import UserError
from commgnn.partition import build_local_partitions, save_partitions
from commgnn.runner import preflight as pf
from commgnn.runner.step_probe import PROBE_MARGIN, probe_graph_from_data, probe_graph_from_dir, probe_hops
from commgnn.sampling.neighbor import NeighborSampler, replicated_source

COMMUNITIES, SIZE, P = 16, 60, 4


def community_graph(seed: int = 0) -> tuple[Data, torch.Tensor]:
    """16 communities of 60 nodes, each node with 8 random neighbours inside its community
    and, one time in ten, one outside (undirected); part = community // 4. The batches of
    one part share most of their neighbourhoods, which the overlap-free bound ignores."""
    g = torch.Generator().manual_seed(seed)
    n = COMMUNITIES * SIZE
    comm = torch.arange(n) // SIZE
    src = torch.arange(n).repeat_interleave(8)
    dst = comm[src] * SIZE + torch.randint(0, SIZE, (src.numel(),), generator=g)
    far = torch.nonzero(torch.rand(n, generator=g) < 0.1).flatten()
    src = torch.cat([src, far])
    dst = torch.cat([dst, torch.randint(0, n, (far.numel(),), generator=g)])
    keep = src != dst
    keys = torch.unique(torch.cat([src[keep] * n + dst[keep], dst[keep] * n + src[keep]]))
    ei = torch.stack([keys // n, keys % n])
    train = torch.rand(n, generator=g) < 0.5
    data = Data(x=torch.randn(n, 8, generator=g), edge_index=ei, y=comm % 3, train_mask=train,
                val_mask=~train, test_mask=torch.zeros(n, dtype=torch.bool), num_nodes=n)
    return data, comm // (COMMUNITIES // P)


def closed_neighbourhood(edge_index: torch.Tensor, n: int, nodes: torch.Tensor) -> torch.Tensor:
    """Reference by a dense adjacency: ``nodes`` and every in-neighbour of them."""
    adj = torch.zeros(n, n, dtype=torch.bool)
    adj[edge_index[1], edge_index[0]] = True  # row v: the sources of v's in-edges
    mask = torch.zeros(n, dtype=torch.bool)
    mask[nodes] = True
    return mask | adj[mask].any(dim=0)


def test_probe_with_full_fanout_counts_each_parts_closed_neighbourhoods():
    """With fan-out -1 (every neighbour) and one batch holding all of a part's seeds, hop k
    gathers exactly the k-hop closed in-neighbourhood of the part's training nodes."""
    data, parts = community_graph()
    hops = probe_hops(probe_graph_from_data(data, parts, P), fanout=(-1, -1), batch_size=10_000)
    n = int(data.num_nodes)
    for r in range(P):
        seeds = torch.nonzero(data.train_mask & (parts == r)).flatten()
        one = closed_neighbourhood(data.edge_index, n, seeds)
        two = closed_neighbourhood(data.edge_index, n, torch.nonzero(one).flatten())
        assert hops[r] == (int(one.sum()), int(two.sum()))


def test_probe_from_a_partition_directory_equals_the_probe_from_the_graph(tmp_path):
    data, parts = community_graph()
    save_partitions(tmp_path / "parts", build_local_partitions(data, parts, P), {"graph_fingerprint": "test"})
    from_data = probe_graph_from_data(data, parts, P)
    from_dir = probe_graph_from_dir(str(tmp_path / "parts"), P)
    assert torch.equal(from_dir.csr.indptr, from_data.csr.indptr)
    assert torch.equal(from_dir.csr.indices, from_data.csr.indices)
    assert all(torch.equal(a.sort().values, b.sort().values) for a, b in zip(from_dir.seeds, from_data.seeds))
    kw = dict(fanout=(5, 3), batch_size=32, seed=3)
    assert probe_hops(from_dir, **kw) == probe_hops(from_data, **kw)


@pytest.mark.parametrize("replace", [False, True])
def test_probed_step_bounds_every_batch_of_an_epoch_and_is_below_the_overlap_free_bound(replace):
    """The probed sizes, with the margin, bound every batch the trainer's sampler draws in
    whole epochs of every part (other seeds than the probe's), and are tighter than the
    bound that counts every sampled neighbour as new."""
    data, parts = community_graph(seed=1)
    fanout, batch = (6, 4), 48
    probe = probe_graph_from_data(data, parts, P)
    hops = probe_hops(probe, fanout=fanout, batch_size=batch, replace=replace)
    n, e = int(data.num_nodes), int(data.edge_index.shape[1])
    steps = -(-max(int(s.numel()) for s in probe.seeds) // batch)
    tighter = 0
    for r, seeds in enumerate(probe.seeds):
        kw = dict(sampler="neighbor", batch_size=batch, fanout=fanout, layers=2, num_nodes=n, num_edges=e,
                  own_nodes=int((parts == r).sum()), replace=replace)
        probed, bound = pf.sampled_per_step(hops=hops[r], **kw), pf.sampled_per_step(**kw)
        assert probed.nodes <= bound.nodes and probed.edges <= bound.edges
        tighter += probed.nodes < bound.nodes
        sampler = NeighborSampler(replicated_source(probe.csr, replace), seeds, list(fanout), batch)
        for epoch in range(3):
            for mb in sampler.epoch(steps, torch.Generator().manual_seed(100 + epoch)):
                assert mb.nodes.numel() <= probed.nodes
                assert all(b.num_dst <= o for b, o in zip(mb.blocks, probed.outs))
                assert sum(b.num_edges for b in mb.blocks) <= probed.edges
        assert max(hops[r]) * PROBE_MARGIN >= probed.nodes  # the probe, not the bound, set it
    assert tighter == P


def launch_inputs(limit_gb: float = 0.0) -> tuple[Data, torch.Tensor, dict, dict, Any]:
    """The community graph as the launcher sees it: data, parts, graph description,
    partition report, and a neighbour-sampling run's config."""
    from commgnn.distributed.context import RuntimeConfig
    from commgnn.models.config import ModelConfig
    from commgnn.partition import partition_report
    from commgnn.runner.config import RunConfig
    from commgnn.sampling.config import SamplerConfig
    from commgnn.trainers.config import TrainConfig

    data, parts = community_graph()
    graph = {"num_nodes": int(data.num_nodes), "num_edges": int(data.edge_index.shape[1]), "num_features": 8,
             "num_classes": 3}
    report = partition_report(data.edge_index, parts, P, data.train_mask).to_dict()
    cfg = RunConfig(model=ModelConfig(name="sage", layers=2), train=TrainConfig(mode="minibatch"),
                    minibatch=SamplerConfig(topology="partitioned", fanout=(6, 4), batch_size=48),
                    runtime=RuntimeConfig(parts=P, memory_limit_gb=limit_gb))
    return data, parts, graph, report, cfg


def test_a_run_the_bound_refuses_passes_with_the_probe(tmp_path):
    """The launcher's wiring: a memory limit between the two estimates refuses the run when
    no probe can be built (no graph, no partition directory) and admits it with a probe of
    the graph or of a saved partition directory."""
    from dataclasses import replace

    from commgnn.runner.prepare import preflight_memory

    data, parts, graph, report, cfg = launch_inputs()
    bound = pf.estimate_for_config(cfg, graph, report)
    probed = pf.estimate_for_config(cfg, graph, report, probe=probe_graph_from_data(data, parts, P))
    assert probed.total < bound.total
    cfg = replace(cfg, runtime=replace(cfg.runtime, memory_limit_gb=(bound.total + probed.total) / 2e9))
    with pytest.raises(UserError, match="estimated"):
        preflight_memory(cfg, graph, report, own=False)
    with pytest.raises(UserError, match="estimated"):  # a limit below both refuses either way
        preflight_memory(replace(cfg, runtime=replace(cfg.runtime, memory_limit_gb=0.99 * probed.total / 1e9)),
                         graph, report, own=False, data=data, parts=parts)
    preflight_memory(cfg, graph, report, own=False, data=data, parts=parts)
    save_partitions(tmp_path / "parts", build_local_partitions(data, parts, P), {"graph_fingerprint": "test"})
    preflight_memory(replace(cfg, partition=replace(cfg.partition, dir=str(tmp_path / "parts"))), graph, report,
                     own=False)


def test_the_launcher_probes_only_a_run_the_bound_refuses(monkeypatch):
    import commgnn.runner.prepare as launch

    built = []
    real = launch.probe_graph_from_data
    monkeypatch.setattr(launch, "probe_graph_from_data", lambda *a: built.append(1) or real(*a))
    data, parts, graph, report, cfg = launch_inputs(limit_gb=1000.0)
    launch.preflight_memory(cfg, graph, report, own=False, data=data, parts=parts)
    assert built == []
