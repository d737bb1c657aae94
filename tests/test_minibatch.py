"""Distributed mini-batch training: the cache on ranks, equal steps with uneven training
nodes, exactness of the degenerate case (all neighbours, one batch) against full-graph
training, VR-GCN's history, a run's records, bad input. The fetch round and the lock-step
sync are in ``test_minibatch_rounds.py``, the topologies in ``test_minibatch_topology.py``."""

from __future__ import annotations

from dataclasses import replace

import copy

import pytest
import torch

from commgnn.runner.config import RunConfig
from commgnn.cli.main import main
from commgnn.comm.sparse_codec import block_bytes
from commgnn.config import from_dict
from commgnn.distributed.context import DistContext
from commgnn.distributed.events import Hooks
from commgnn.errors import ConfigError, UserError
from commgnn.fetch.config import FetchConfig
from commgnn.models import ModelConfig
from commgnn.partition import build_local_partition
from commgnn.sampling.config import SamplerConfig
from commgnn.trainers import TrainConfig
from commgnn.trainers.minibatch import MiniBatchTrainer
from helpers import run_on_ranks, small_graph
import mb_ranks
from mb_ranks import mkdir as _mk, random_parts as _parts, small_cfgs as _cfgs
@pytest.mark.timeout(240)
def test_all_neighbours_in_one_batch_equals_full_graph_training(tmp_path):
    """Every neighbour (fan-out -1 on the replicated CSR; a fan-out above every degree
    when owners sample a partitioned topology) and one batch holding all training nodes:
    the sampled step is the full-graph step, so two mini-batch ranks match full-graph
    training, with and without prefetch and with a 4-bit-free cache in the way, and so does
    VR-GCN on two ranks (its precomputed first layer and history-corrected upper ones);
    the model has a LayerNorm between its layers (``model.norm``)."""
    data = small_graph(n=90, m=360)
    parts = _parts(90, 2, 3)
    model, train = _cfgs()
    model = replace(model, norm="layer")  # LayerNorm between layers: blocks and VR-GCN's streams too
    fg = run_on_ranks(mb_ranks.train_fullgraph, 2, _mk(tmp_path / "fg"), data, parts, model, train, 3)
    settings = {
        "replicated": (SamplerConfig(sampler="neighbor", fanout=(-1, -1), batch_size=1000), FetchConfig()),
        # VR-GCN's control variate: mean over sampled (h - history) + mean over all history,
        # the exact aggregate when every neighbour is sampled, whatever the history holds
        "vrgcn": (SamplerConfig(sampler="vrgcn", fanout=(-1, -1), batch_size=1000), FetchConfig()),
        # one batch an epoch here: prefetch runs each fetch on its thread, with no batch ahead
        # to overlap (the look-ahead is tested over many steps in test_minibatch_rounds.py)
        "partitioned+prefetch+lru": (SamplerConfig(sampler="neighbor", fanout=(500, 500), batch_size=1000,
                                                   topology="partitioned"),
                                     FetchConfig(prefetch=True, cache_ratio=0.5, cache_policy="lru")),
        # its whole in-edge lists from the owners (RemoteInEdges), on the prefetch thread too
        "vrgcn partitioned+prefetch": (SamplerConfig(sampler="vrgcn", fanout=(500, 500), batch_size=1000,
                                                     topology="partitioned"), FetchConfig(prefetch=True)),
    }
    for name, (sampler, fetch) in settings.items():
        mb = run_on_ranks(mb_ranks.train_minibatch, 2, _mk(tmp_path / name), data, parts, model, train, sampler,
                          fetch, 3)
        for k, v in fg[0]["state"].items():
            assert torch.allclose(mb[0]["state"][k], v, atol=1e-5), (name, k)
            assert torch.equal(mb[0]["state"][k], mb[1]["state"][k])  # ranks agree
        assert [r.val_acc for r in mb[0]["results"]] == [r.val_acc for r in mb[1]["results"]]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("topology, policies", [
    ("replicated", ("degree", "presample", "lru")),
    ("partitioned", ("presample",))])
def test_every_cache_policy_trains_exactly_as_no_cache(tmp_path, topology, policies):
    """fp32 rows from a cache are the owners' rows, and filling or consulting a cache draws
    nothing from the sampling streams: with each policy (degree, GNNLab's pre-sampled
    hotness, LRU) two ranks train bit for bit as without a cache, while the cache serves
    a share of the remote requests. Pre-sampling over a partitioned topology also asks
    the owners for neighbours; their serving streams are put back too."""
    data = small_graph(n=120, m=500)
    parts = _parts(120, 2, 5)
    model, train = _cfgs()
    sampler = SamplerConfig(sampler="neighbor", fanout=(3, 3), batch_size=16, topology=topology)
    ref = run_on_ranks(mb_ranks.train_minibatch, 2, _mk(tmp_path / "none"), data, parts, model, train, sampler,
                       FetchConfig(), 2)
    for policy in policies:
        got = run_on_ranks(mb_ranks.train_minibatch, 2, _mk(tmp_path / policy), data, parts, model, train, sampler,
                           FetchConfig(cache_ratio=0.3, cache_policy=policy), 2)
        for r, want in zip(got, ref):
            for k, v in want["state"].items():
                assert torch.equal(r["state"][k], v), (policy, k)
            log = r["logs"][-1]
            assert 0 < log["cache_hits"] < log["remote_requests"], (policy, log)
            assert log["rows_fetched"] == log["remote_requests"] - log["cache_hits"]
            if policy == "lru":  # Belady's eviction bounds every cache that starts empty (epoch 1) and
                first = r["logs"][0]  # admits on a miss; later epochs begin with the LRU warm
                assert 0 < first["cache_hit_rate"] <= first["cache_hit_rate_belady"] + 1e-12
            assert r["sent"]["fetch_rows"] < want["sent"]["fetch_rows"], policy


@pytest.mark.timeout(180)
@pytest.mark.parametrize("sampler, n1, topology", [("neighbor", 11, "auto"), ("cluster", 11, "auto"),
                                                   ("neighbor", 3, "auto"), ("saint-rw", 11, "auto"),
                                                   ("vrgcn", 3, "partitioned"), ("saint-rw", 3, "partitioned"),
                                                   ("saint-node", 0, "partitioned")])
def test_uneven_training_nodes_take_equal_steps_without_hanging(tmp_path, sampler, n1, topology):
    """Rank 0 holds 10x the training nodes of rank 1 (or 37x: then rank 1 has fewer seeds
    than steps, so some of its batches are empty): both take the same number of steps (the
    collective time-out stays short, 20 s, so a hang would fail the test), also over a
    partitioned topology, where VR-GCN's and GraphSAINT's empty batches (rank 1 without a
    training node at all in the last case) still ask the owners; and in every
    epoch the batches that trained covered each rank's training nodes exactly once (all
    but GraphSAINT's draws)."""
    data = small_graph(n=240, m=900)
    parts = (torch.arange(240) >= 120).long()
    data.train_mask = torch.zeros(240, dtype=torch.bool)
    data.train_mask[:110] = True      # rank 0: 110 training nodes
    data.train_mask[120:120 + n1] = True  # rank 1: n1
    data.val_mask = ~data.train_mask & (torch.arange(240) % 2 == 0)
    data.test_mask = ~data.train_mask & ~data.val_mask
    model, train = _cfgs()
    cfg = from_dict(SamplerConfig, {"sampler": sampler, "fanout": [4, 4], "batch_size": 16, "topology": topology,
                                    "cluster": {"num_clusters": 12, "clusters_per_batch": 2},
                                    "saint": {"budget": 20}})
    res = run_on_ranks(mb_ranks.train_minibatch, 2, tmp_path, data, parts, model, train, cfg,
                       FetchConfig(cache_ratio=0.2, cache_policy="lru"), 2, timeout_s=20.0)
    expected = {"neighbor": 7, "vrgcn": 7, "cluster": 6}.get(sampler)  # ceil(110 / 16); ceil(12 / 2)
    assert res[0]["steps"] == res[1]["steps"]
    assert expected is None or res[0]["steps"] == expected
    for r in res:
        assert len(r["logs"]) == 2 and r["logs"][0]["steps"] == r["steps"]
        assert all(bool(torch.isfinite(v).all()) for v in r["state"].values())  # empty batches add no NaN
        if not sampler.startswith("saint"):  # (GraphSAINT draws subgraphs, it does not sweep)
            for covered in r["covered"]:
                assert torch.equal(torch.sort(covered).values, torch.sort(r["own_train"]).values)


def test_vrgcn_history_holds_the_activations_each_step_computed():
    data = small_graph(n=60, m=300)
    part = build_local_partition(data, torch.zeros(60, dtype=torch.long), 1, 0)
    model = ModelConfig(name="sage", layers=3, hidden=6, dropout=0.0)
    t = MiniBatchTrainer(DistContext.single(), part, model, TrainConfig(epochs=1), Hooks(),
                         sampler_cfg=SamplerConfig(sampler="vrgcn", fanout=(2, 2, 2), batch_size=10),
                         fetch_cfg=FetchConfig())
    batch = t.sampler.sample(part.global_ids[part.train_mask][:10], torch.Generator().manual_seed(0))
    rows = t.fetcher.fetch(batch.nodes)
    g = torch.Generator().manual_seed(1)
    for l in (1, 2):  # a history that is not the activations, so both terms of c count
        t.history[l].copy_(torch.randn(t.history[l].shape, generator=g))
    before = [t.history[l].clone() for l in (1, 2)]
    t.net.train()
    t.net(rows, batch)
    # layer 1's input rows are exact (precomputed aggregate): recompute them directly
    conv0 = t.model.convs[0]
    n1 = batch.blocks[0].num_dst
    F = data.x.shape[1]
    h1 = torch.relu(conv0.from_precomputed(rows[:n1, F:], rows[:n1, :F], None)).detach()
    ids1 = batch.nodes[: batch.blocks[1].num_src]
    assert torch.allclose(t.history[1][ids1], h1, atol=1e-6)
    # layer 2's rows, act(W_l c + b + W_r h1[:num_dst]), with VR-GCN's control variate over
    # the history before the step, c = A (h1 - hbar_1[ids1]) + A_full hbar_1: A the block's
    # mean over its sampled edges, A_full the mean over every in-edge, here from the graph
    blk = batch.blocks[1]
    src, dst = blk.edge_index
    k = torch.bincount(dst, minlength=blk.num_dst).clamp(min=1).to(h1.dtype)
    c = torch.zeros(blk.num_dst, h1.shape[1])
    c.index_add_(0, dst, (h1 - before[0][ids1])[src] / k[dst, None])
    g_src, g_dst = data.edge_index
    for j, v in enumerate(batch.nodes[: blk.num_dst].tolist()):
        nb = g_src[g_dst == v]
        if nb.numel():
            c[j] += before[0][nb].mean(0)
    conv1 = t.model.convs[1]
    with torch.no_grad():
        h2 = torch.relu(conv1.lin_l(c) + conv1.lin_r(h1[: blk.num_dst]))
    ids2 = batch.nodes[: batch.blocks[2].num_src]
    assert torch.allclose(t.history[2][ids2], h2, atol=1e-5)
    untouched = torch.ones(60, dtype=torch.bool)
    untouched[ids1] = False
    assert torch.equal(t.history[1][untouched], before[0][untouched])  # nothing else written


@pytest.mark.parametrize("sampler", ["saint-node", "saint-edge", "saint-rw"])
def test_saint_samplers_train_in_the_trainer(sampler):
    """Each GraphSAINT sampler drives the trainer (its normalisation weights in the loss and
    the aggregation): the training loss falls and training accuracy rises over the epochs."""
    data = small_graph(n=120, m=600, f=16)
    part = build_local_partition(data, torch.zeros(120, dtype=torch.long), 1, 0)
    cfg = from_dict(SamplerConfig, {"sampler": sampler, "saint": {"budget": 40, "presample": 20}})
    t = MiniBatchTrainer(DistContext.single(), part, ModelConfig(name="sage", hidden=32, dropout=0.0),
                         TrainConfig(epochs=30, lr=0.05, weight_decay=0.0), Hooks(), sampler_cfg=cfg,
                         fetch_cfg=FetchConfig())
    results = [t.step() for _ in range(30)]
    assert all(torch.isfinite(torch.tensor(r.loss)) for r in results)
    assert sum(r.loss for r in results[-5:]) < 0.7 * sum(r.loss for r in results[:5]), [r.loss for r in results]
    assert results[-1].train_acc > results[0].train_acc + 0.15, (results[0].train_acc, results[-1].train_acc)


@pytest.mark.parametrize("table, message", [
    ({"train": {"mode": "minibatch"}, "model": {"name": "sage", "layers": 3}}, "fanout has 2 entries"),
    ({"train": {"mode": "minibatch"}, "model": {"name": "gcn"}}, "does not fit model 'gcn'"),
    ({"train": {"mode": "minibatch"}, "model": {"name": "sage"}, "minibatch": {"batch_size": 0}},
     "minibatch.batch_size must be > 0"),
    ({"train": {"mode": "minibatch"}, "model": {"name": "sage"}, "comm": {"halo": {"bits": 8}}},
     r"\[comm.halo\] levers act on full-graph training"),
    ({"train": {"mode": "minibatch"}, "model": {"name": "sage"}, "runtime": {"device": "cuda"}},
     "train.mode = 'minibatch' runs on the CPU"),
    ({"fetch": {"cache_mb": 5, "cache_ratio": 0.1}}, "not both"),
    ({"fetch": {"bits": "adaptive"}}, "needs fetch.budget_mb > 0"),
    ({"fetch": {"bits": 3}}, "fetch.bits must be one of 1, 2, 4, 8, 32 or 'adaptive'"),
])
def test_bad_minibatch_settings_are_config_errors(table, message):
    with pytest.raises(ConfigError, match=message):
        from_dict(RunConfig, table)


def test_no_rank_draws_another_ranks_stream():
    from commgnn.trainers.config import STREAMS, SEED_LIMIT, stream_seed

    seeds = [stream_seed(s, r, p) for s in (0, 1, SEED_LIMIT - 1) for r in range(64) for p in STREAMS]
    assert len(set(seeds)) == len(seeds) and max(seeds) < 2**63


def test_minibatch_resolves_auto_to_the_cpu_and_takes_the_sparse_set_up_setting():
    """device = auto would pick CUDA on a GPU host, where the sampled path's CPU tensors
    would meet CUDA ones; full-graph training keeps auto."""
    mb = from_dict(RunConfig, {"train": {"mode": "minibatch"}, "model": {"name": "sage"},
                               "comm": {"halo": {"sparse_setup": False}}})
    assert mb.effective_runtime.device == "cpu" and mb.comm.halo.sparse_setup is False
    assert mb.runtime.device == "auto"  # the config keeps auto: in full-graph mode it means CUDA where there is one
    assert from_dict(RunConfig, {}).effective_runtime.device == "auto"


@pytest.mark.parametrize("flags, message", [
    (["--fanout", "5,5,5"], "minibatch.fanout has 3 entries (5,5,5) but the model has 2 layers"),
    (["--batch-size", "0"], "minibatch.batch_size must be > 0"),
    (["--cache-mb", "1e12"], "exceeds the available memory"),
    (["--model", "gcn"], "sampler 'neighbor' does not fit model 'gcn'"),
    (["--sampler", "vrgcn", "--layers", "1", "--fanout", "2"], "sampler 'vrgcn' needs model.layers >= 2"),
])
def test_bad_minibatch_flags_exit_2_with_one_line(tmp_path, capsys, flags, message):
    code = main(["train", "--mode", "minibatch", "--model", "sage", "--parts", "2", "--epochs", "1", "--quiet",
                 "--out", str(tmp_path / "run"), *flags])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("commgnn: error:") and message in err and "\n" not in err, err
    assert not (tmp_path / "run").exists()


def test_sparse_first_layer_equals_the_dense_one():
    """On a mostly-zero input the first layer runs on the non-zeros; without dropout it
    matches the dense computation (outputs and weight gradients), and with dropout its
    mean over many draws matches too (same law)."""
    from commgnn.models.blocks import BlockGNN
    from commgnn.models.net import PartitionGNN
    from commgnn.sampling.csr import CSRTopology
    from commgnn.sampling.neighbor import NeighborSampler, replicated_source

    data = small_graph(n=80, m=400, f=40)
    data.x = data.x * (torch.rand(80, 40, generator=torch.Generator().manual_seed(1)) < 0.05)
    csr = CSRTopology.from_edge_index(data.edge_index, 80)
    batch = NeighborSampler(replicated_source(csr, False), torch.arange(20), [3, 3], 20).sample(
        torch.arange(20), torch.Generator().manual_seed(0))
    rows = data.x[batch.nodes]
    torch.manual_seed(0)
    gnn = PartitionGNN(ModelConfig(name="sage", hidden=16, dropout=0.0), 40, 3)
    outs, grads = [], []
    for sparse in (False, True):
        gnn.zero_grad()
        out = BlockGNN(gnn, sparse_input=sparse).train()(rows, batch)
        out.square().sum().backward()
        outs.append(out.detach())
        grads.append([p.grad.clone() for p in gnn.parameters()])
    assert torch.allclose(outs[0], outs[1], atol=1e-5)
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-4)
    gnn.cfg = ModelConfig(name="sage", hidden=16, dropout=0.5)
    with torch.no_grad():
        draws = [torch.stack([BlockGNN(gnn, sparse_input=s).train()(rows, batch) for _ in range(400)])
                 for s in (False, True)]
    # The two means differ by less than 5 standard errors of their difference, entry by entry.
    se = ((draws[0].var(0) + draws[1].var(0)) / 400).sqrt()
    assert bool(((draws[0].mean(0) - draws[1].mean(0)).abs() < 5 * se + 1e-6).all())
    # ...and the test can fail: dropout without its 1 / (1 - p) rescaling halves the kept
    # mean, far beyond that bound
    assert not bool(((draws[0].mean(0) - 0.5 * draws[1].mean(0)).abs() < 5 * se + 1e-6).all())


def test_a_resumed_minibatch_run_continues_exactly():
    """state_dict after one epoch, loaded into a fresh trainer, gives the same second epoch
    as an uninterrupted run (sampler stream, VR-GCN history, optimiser; one rank, so no
    remote rows: the cache's resume is test_resume.py's 2-rank mini-batch case)."""
    data = small_graph(n=60, m=300)
    part = build_local_partition(data, torch.zeros(60, dtype=torch.long), 1, 0)
    model = ModelConfig(name="sage", hidden=8)
    cfg = SamplerConfig(sampler="vrgcn", fanout=(2, 2), batch_size=8)

    def trainer() -> MiniBatchTrainer:
        return MiniBatchTrainer(DistContext.single(), part, model, TrainConfig(epochs=3), Hooks(),
                                sampler_cfg=cfg, fetch_cfg=FetchConfig())

    a = trainer()
    a.step()
    saved = copy.deepcopy(a.state_dict())  # a checkpoint is written out at once; here a copy
    a.step()
    b = trainer()
    b.load_state_dict(saved)
    b.step()
    for (k, v), w in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        assert torch.equal(v, w), k
    assert torch.equal(a.history[1], b.history[1])
    # a run that sampled a partitioned topology (topology = auto, less memory then) is not
    # resumed on a replicated one: one clear error instead of other samples
    assert saved["minibatch"]["topology"] == b.topology == "replicated"
    saved["minibatch"]["topology"] = "partitioned"
    with pytest.raises(UserError, match="set minibatch.topology = 'partitioned' in the run's config.toml"):
        trainer().load_state_dict(saved)


@pytest.mark.timeout(120)
def test_minibatch_run_records_its_summary_keys(tmp_path):
    out = tmp_path / "run"
    cfg = tmp_path / "small.toml"
    cfg.write_text("[data.synthetic]\nnum_nodes = 400\nnum_classes = 3\navg_degree = 6.0\nfeature_dim = 8\n"
                   "[model]\nname = 'sage'\nhidden = 8\n[train]\nepochs = 2\nmode = 'minibatch'\n"
                   "[minibatch]\nbatch_size = 64\nfanout = [4, 4]\n[fetch]\ncache_ratio = 0.2\n")
    assert main(["train", "--config", str(cfg), "--parts", "2", "--quiet", "--out", str(out)]) == 0
    import json

    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert summary["steps_per_epoch"] == rows[0]["steps"] >= 2  # ceil(~120 / 64) on the larger rank
    per_epoch = [r["bytes"]["fetch_ids"] + r["bytes"]["fetch_rows"] for r in rows]
    assert summary["feature_bytes_per_epoch"] == sum(per_epoch) / 2 > 0
    hits = sum(r["cache_hits"] for r in rows)
    assert summary["cache_hit_rate"] == hits / sum(r["remote_requests"] for r in rows)
    # each hit kept a 4-byte id and an 8-wide fp32 row off the wire
    assert [r["cache_bytes_saved"] for r in rows] == [r["cache_hits"] * (4 + 8 * 4) for r in rows]
    # a static (degree) cache cannot beat the best static set of its size on the same trace
    assert 0 < summary["cache_hit_rate"] <= summary["cache_hit_rate_optimal"] + 1e-12
    # (a pre-filled static cache can beat Belady, which starts empty and admits on a miss)
    assert summary["cache_hit_rate_belady"] == pytest.approx(
        sum(r["cache_hit_rate_belady"] * r["remote_requests"] for r in rows) / sum(r["remote_requests"] for r in rows))
    assert summary["setup_bytes"]["fetch_setup"] > 0  # the static cache was filled once
    for r in rows:
        # each step, every rank sends its peer one 8-byte count and a 4-byte id per row it
        # still asks for; the 8-wide fp32 rows come back
        assert r["bytes"]["fetch_ids"] == 2 * r["steps"] * 8 + 4 * r["rows_fetched"]
        assert r["bytes"]["fetch_rows"] == r["rows_fetched"] * 8 * 4
        assert r["rows_fetched"] == r["remote_requests"] - r["cache_hits"] > 0
        # fan-out 4,4 from at most 64 seeds: 64 (1 + 4) (1 + 4) nodes and 64 * 4 + 320 * 4
        # edges a step at most (the graph itself has ~2,400 edges)
        assert 64 <= r["sampled_nodes_per_step"] <= 1600 and 64 < r["sampled_edges_per_step"] <= 1536
        t = r["time_mean_s"]
        assert min(t["sample"], t["fetch"], t["comm"], t["compute"]) > 0
        assert t["sample"] + t["fetch"] + t["comm"] + t["wait"] + t["compute"] == pytest.approx(t["epoch"])


@pytest.mark.timeout(180)
def test_the_issues_command_line_trains(tmp_path):
    """``commgnn train --mode minibatch --sampler neighbor --fanout 15,10 --batch-size 1024
    --cache-mb 64 --cache-policy degree``, as written (no ``--model``: a mini-batch run
    trains GraphSAGE), on a synthetic graph of 6,000 nodes: 64 MB hold every remote row
    the sampler can ask for, so after the one set-up fill no row crosses the wire."""
    import json

    data = tmp_path / "data.toml"
    data.write_text("[data.synthetic]\nnum_nodes = 6000\nnum_classes = 3\navg_degree = 6.0\nfeature_dim = 8\n"
                    "[model]\nhidden = 8\n[train]\nepochs = 2\n")
    out = tmp_path / "run"
    assert main(["train", "--config", str(data), "--parts", "2", "--quiet", "--out", str(out),
                 "--mode", "minibatch", "--sampler", "neighbor", "--fanout", "15,10", "--batch-size", "1024",
                 "--cache-mb", "64", "--cache-policy", "degree"]) == 0
    import tomllib

    resolved = tomllib.loads((out / "config.toml").read_text())
    assert resolved["model"]["name"] == "sage"
    assert resolved["minibatch"]["fanout"] == [15, 10] and resolved["minibatch"]["batch_size"] == 1024
    assert (resolved["fetch"]["cache_mb"], resolved["fetch"]["cache_policy"]) == (64, "degree")
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert summary["steps_per_epoch"] == rows[0]["steps"] >= 2  # ~1,800 training nodes a rank
    assert summary["cache_hit_rate"] == summary["cache_hit_rate_optimal"] == 1.0
    assert all(r["rows_fetched"] == 0 and r["bytes"]["fetch_rows"] == 0 < r["remote_requests"] for r in rows)
    assert summary["setup_bytes"]["fetch_setup"] > 0


@pytest.mark.timeout(120)
def test_a_cache_fill_does_not_count_as_an_epochs_traffic_for_adaptive_bits(tmp_path):
    data = small_graph(n=120, f=16)
    for without_fill, with_fill in run_on_ranks(mb_ranks.fetch_adaptive_after_fill, 3, tmp_path, data,
                                                _parts(120, 3, 5), 3000.0):
        assert with_fill == without_fill and any(b < 8 for b in with_fill), (without_fill, with_fill)


@pytest.mark.timeout(120)
def test_adaptive_fetch_bits_fit_the_budget_and_stay_within_a_step(tmp_path):
    """Epoch 1 fetches at 8 bits; then each asker picks per-owner widths whose bytes fit its
    budget (the same request volume each epoch here), and every row stays within one
    quantisation step of the owner's (or equals it at 32 bits)."""
    data = small_graph(n=120, f=16)
    budget = 3000.0  # bytes of rows received per epoch per rank
    parts = _parts(120, 3, 5)
    res = run_on_ranks(mb_ranks.fetch_adaptive, 3, tmp_path, data, parts, budget, 3, 4)
    for r in res:
        assert r["bits"][0] == [8, 8, 8]
        assert any(b < 8 for b in r["bits"][1]), r["bits"]
        for i, (ids, rows) in enumerate(zip(r["asked"], r["served"])):  # 4 steps an epoch
            truth = data.x[ids]
            width = torch.tensor(r["bits"][i // 4], dtype=torch.float64)[parts[ids]]  # per owner, this epoch's
            step = (truth.max(1).values - truth.min(1).values) / (2 ** width - 1)
            assert ((rows - truth).abs() <= step[:, None] * (1 + 1e-5) + 1e-6).all(), (i, r["bits"][i // 4])
    # what the ranks received in epochs 2-3 (= what they were sent) fits their budgets in total
    for epoch in (1, 2):
        assert sum(r["received"][epoch] for r in res) <= 3 * budget * 1.15
    assert sum(r["received"][0] for r in res) > 3 * budget  # 8 bits did not fit: the solver had work


def test_the_cache_memory_check_counts_every_rank_on_the_host():
    import psutil

    from commgnn.trainers.mb_setup import cache_capacity

    mb = 0.4 * psutil.virtual_memory().available / 1e6  # fits once, not four times
    cfg = FetchConfig(cache_mb=mb)
    assert cache_capacity(cfg, 10, 8, 4, local_ranks=1) > 0
    with pytest.raises(ConfigError, match="per rank x 4 ranks on this host exceeds the available memory"):
        cache_capacity(cfg, 10, 8, 4, local_ranks=4)


@pytest.mark.parametrize("sampler", ["neighbor", "vrgcn", "saint-node", "saint-edge", "saint-rw", "cluster"])
def test_cache_candidates_are_what_the_sampler_can_request(sampler):
    """The remote rows a cache may hold are those the sampler's batches can ask for: every
    remote node of many sampled batches lies among them, and the reach is not wider than
    the sampler's (VR-GCN one hop less than neighbour sampling, Cluster-GCN none)."""
    from commgnn.sampling.csr import CSRTopology
    from commgnn.trainers.mb_setup import build_sampler, remote_candidates, sampler_reach

    data = small_graph(n=150, m=300, f=4)
    parts = _parts(150, 3, 2)
    part = build_local_partition(data, parts, 3, 0)
    csr = CSRTopology.from_edge_index(data.edge_index, 150)
    owner, row = parts.clone(), torch.zeros(150, dtype=torch.long)
    cfg = from_dict(SamplerConfig, {"sampler": sampler, "fanout": [3, 3], "batch_size": 8,
                                    "saint": {"budget": 20, "presample": 5, "walk_length": 3}})
    frontier, hops = sampler_reach(cfg, 2)
    cand = set(remote_candidates(part, csr, owner, hops, frontier=frontier).tolist())
    s = build_sampler(cfg, DistContext.single(), Hooks(), part, layers=2, csr=csr, owner=owner, row=row, seed=0)
    g = torch.Generator().manual_seed(1)
    asked = set()
    for _ in range(20):
        for batch in s.epoch(max(1, s.num_batches()), g):
            asked |= {int(v) for v in batch.nodes if int(owner[v]) != 0}
    assert asked <= cand, sorted(asked - cand)
    assert {"neighbor": ("train", 2), "vrgcn": ("train", 1), "saint-node": ("own", 1), "saint-edge": ("own", 1),
            "saint-rw": ("train-or-own", 3), "cluster": ("train", 0)}[sampler] == (frontier, hops)
    if sampler == "cluster":
        assert not cand and not asked
        with pytest.raises(ConfigError, match="nothing to cache"):
            from_dict(RunConfig, {"train": {"mode": "minibatch"}, "model": {"name": "sage"},
                                  "minibatch": {"sampler": "cluster"}, "fetch": {"cache_ratio": 0.1}})
    else:
        assert asked, "the sampler asked for no remote row: the test graph is too small to tell"



def _bag_of_words(n: int = 90, f: int = 400, seed: int = 4):
    data = small_graph(n=n, f=f, seed=seed)
    g = torch.Generator().manual_seed(seed)
    data.x = (torch.rand(n, f, generator=g) < 0.03).float()
    data.x[torch.arange(n), data.y] = 1.0  # a class word
    return data


@pytest.mark.timeout(120)
@pytest.mark.parametrize("policy", [None, "lru"])
def test_sparse_fetch_serves_the_owners_rows_bit_for_bit_in_far_fewer_bytes(tmp_path, policy):
    """Bag-of-words rows (3% of 400 columns, all 1.0) through the sparse codec: the served
    rows equal the owners', every byte of the blocks and their sizes is counted, and a row
    costs a few dozen bytes instead of 1,600."""
    data = _bag_of_words()
    dense = run_on_ranks(mb_ranks.fetch_rows, 3, tmp_path, data, _parts(90, 3), 32, policy, 6)
    (tmp_path / "s").mkdir()
    sparse = run_on_ranks(mb_ranks.fetch_rows, 3, tmp_path / "s", data, _parts(90, 3), 32, policy, 6, True)
    for d, s in zip(dense, sparse):
        for ids, rows in zip(s["asked"], s["served"]):
            assert torch.equal(rows, data.x[ids])
        assert s["fetched"] == d["fetched"] > 0 and s["hits"] == d["hits"]
        assert s["ids_bytes"] == d["ids_bytes"]  # the requests travel as before
        if policy == "lru":
            assert 0 < s["saved"] < d["saved"] / 20
    # rows_bytes: what each rank served; in all, every fetched row
    assert sum(d["rows_bytes"] for d in dense) == sum(d["fetched"] for d in dense) * 400 * 4
    # per step and asker: an 8-byte block size and a block of 1 format byte, a 2-byte count
    # per row and ~13 2-byte column indices per row
    total = sum(s["rows_bytes"] for s in sparse)
    assert total < sum(d["rows_bytes"] for d in dense) / 20, total
    if policy is None:  # every remote row asked for travels: exactly a size and a block per owner and step
        owner = _parts(90, 3)
        expect = sum(8 + block_bytes(data.x[ids[owner[ids] == q]])
                     for r, s in enumerate(sparse) for ids in s["asked"] for q in range(3)
                     if q != r and bool((owner[ids] == q).any()))
        assert total == expect


@pytest.mark.timeout(180)
def test_sparse_fetch_trains_identically():
    """Mini-batch training with the sparse fetch is the fp32 fetch's, bit for bit, with
    fewer feature bytes; it refuses quantised bits."""
    import json
    import tempfile
    from pathlib import Path

    import commgnn

    data = _bag_of_words(n=300, f=300, seed=5)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for sparse in (False, True):
            run = Path(tmp) / str(sparse)
            commgnn.train(data, model="sage", parts=2, mode="minibatch", fanout=[4, 4], batch_size=32, epochs=2,
                          hidden=8, fetch_sparse=sparse, quiet=True, out=run)
            out[sparse] = (json.loads((run / "summary.json").read_text()),
                           [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()])
    (sd, md), (ss, ms) = out[False], out[True]
    assert [r["loss"] for r in ms] == [r["loss"] for r in md] and ss["test_acc"] == sd["test_acc"]
    assert 0 < ss["feature_bytes_per_epoch"] < sd["feature_bytes_per_epoch"] / 5
    with pytest.raises(ConfigError, match="does not combine with fetch.bits = 4"):
        FetchConfig(sparse=True, bits=4)


@pytest.mark.timeout(180)
def test_binary_rows_at_four_bits_train_exactly_as_fp32_with_any_cache():
    """0/1 rows decode exactly at 4 bits (a row's maximum is the top level) and stochastic
    rounding draws from no training stream, so a 4-bit fetch, with or without a cache, trains
    bit for bit as the fp32 fetch: on binary features a cache setting changes bytes only
    (what the benchmarks' cache grid relies on for its accuracy column)."""
    import json
    import tempfile
    from pathlib import Path

    import commgnn

    data = _bag_of_words(n=300, f=300, seed=5)
    runs = {"fp32": {}, "4-bit": {"fetch_bits": 4},
            "4-bit, 25% degree": {"fetch_bits": 4, "cache_ratio": 0.25, "cache_policy": "degree"},
            "4-bit, 10% lru": {"fetch_bits": 4, "cache_ratio": 0.1, "cache_policy": "lru"}}
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in runs.items():
            run = Path(tmp) / name.replace(" ", "").replace(",", "").replace("%", "")
            commgnn.train(data, model="sage", parts=2, mode="minibatch", fanout=[4, 4], batch_size=32, epochs=3,
                          hidden=8, quiet=True, out=run, **extra)
            out[name] = (json.loads((run / "summary.json").read_text()),
                         [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()])
    ref_s, ref_m = out["fp32"]
    for name, (s, m) in out.items():
        assert [r["loss"] for r in m] == [r["loss"] for r in ref_m], name
        assert s["test_acc"] == ref_s["test_acc"], name
        if name != "fp32":
            assert s["feature_bytes_per_epoch"] < ref_s["feature_bytes_per_epoch"] / 5, name
    assert out["4-bit, 25% degree"][0]["cache_hit_rate"] > 0 and out["4-bit, 10% lru"][0]["cache_hit_rate"] > 0
