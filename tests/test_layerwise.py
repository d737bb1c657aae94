"""Layer-wise inference (:mod:`commgnn.trainers.layerwise`) gives the full-graph forward's
scores and embeddings, on one rank and across ranks, with chunks smaller than a rank."""

from __future__ import annotations

import importlib
import math

import numpy as np
import pytest
import torch

from commgnn.data import load_dataset
from commgnn.errors import ConfigError
from commgnn.runner.config import resolve_config
from commgnn.models import ModelConfig
from commgnn.sampling.config import SamplerConfig
from commgnn.trainers import TrainConfig
from commgnn.trainers.layerwise import chunk_bounds
from commgnn.trainers.mb_setup import choose_inference
from helpers import run_on_ranks, small_graph
import mb_ranks
from mb_ranks import random_parts


@pytest.mark.timeout(120)
@pytest.mark.parametrize("P,chunk,transform_first", [(1, 7, False), (3, 5, False), (2, 1000, True)])
def test_layerwise_scores_equal_the_full_graph_forward(tmp_path, P, chunk, transform_first):
    data = small_graph(n=90, m=500)
    # dropout: eval mode must drop nothing; one case with LayerNorm between layers
    model = ModelConfig(name="sage", hidden=6, layers=3, dropout=0.3, norm="layer" if transform_first else "none")
    if transform_first:  # the message is h W^T when narrower: 16 features -> 6 hidden
        data.x = torch.randn(90, 16, generator=torch.Generator().manual_seed(1))
    res = run_on_ranks(mb_ranks.layerwise_against_full, P, tmp_path, data, random_parts(90, P, 3), model,
                       TrainConfig(epochs=1, lr=0.05, seed=2), chunk)
    for r in res:
        assert r["full"].shape == r["lw"].shape and r["full"].shape[1] == int(data.y.max()) + 1
        torch.testing.assert_close(r["lw"], r["full"], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(r["lw_h"], r["full_h"], rtol=1e-5, atol=1e-6)
        # the chosen rows alone (rank 0 of several chose none): their scores and embeddings
        for scores, h1, h0 in r["picked"].values():  # features read once, or summed by their owners
            assert scores.shape == (r["pick"].numel(), r["full"].shape[1])
            torch.testing.assert_close(scores, r["full"][r["pick"]], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(h1, r["lw_1"][r["pick"]], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(h0, r["full_h"][r["pick"]], rtol=1e-5, atol=1e-6)
    assert sum(r["pick"].numel() for r in res) > 0
    if P > 1:
        # Every halo row is the source of an owned node's in-edge, so each layer sends it
        # (an id out, float32 values back) at least once; one chunk a rank sends it once.
        F, H = data.x.shape[1], 6
        halo_bytes = sum(r["halo"] for r in res) * (8 + 4 * F + 8 + 4 * H + 8 + 4 * H)
        sent = sum(r["eval_bytes"] for r in res)
        assert sent >= halo_bytes
        if all(r["own"] <= chunk for r in res):
            assert sent <= halo_bytes + 2 * 3 * P * (P - 1) * 8  # plus the per-peer counts
    for r in res:  # evaluation (layer-wise here) counts what the scores say
        correct = r["lw"].argmax(1) == r["y"]
        assert torch.equal(r["counts"], (r["masks"] & correct).sum(1).to(torch.float64))


def test_chunks_end_at_their_rows_or_their_edges():
    deg = torch.tensor([0, 5, 1, 1, 10, 0, 2, 2])
    ptr = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(deg, 0)])
    for dst in (None, torch.tensor([7, 4, 1, 2, 3])):
        rows = torch.arange(8) if dst is None else dst
        bounds = chunk_bounds(ptr, dst, rows.numel(), 3, 4)
        assert bounds[0][0] == 0 and bounds[-1][1] == rows.numel()
        assert all(b0[1] == b1[0] for b0, b1 in zip(bounds, bounds[1:]))  # contiguous, in order
        for a, b in bounds:
            edges = int(deg[rows[a:b]].sum())
            assert 0 < b - a <= 3 and (edges <= 4 + int(deg[rows[a:b]].max()))
    # rows 0..7, in-edges before each [0, 0, 5, 6, 7, 17, 17, 19]: i // 3 + E_i // 4 =
    # [0, 0, 1, 2, 2, 5, 6, 6]
    assert chunk_bounds(ptr, None, 8, 3, 4) == [(0, 2), (2, 3), (3, 5), (5, 6), (6, 8)]
    assert chunk_bounds(ptr, None, 8, 3, 1000) == [(0, 3), (3, 6), (6, 8)]


def test_auto_picks_layerwise_only_when_the_full_forward_would_crowd_memory():
    cfg = SamplerConfig()
    kw = dict(own=500_000, rows=1_000_000, edges=10_000_000, width=128, num_features=128, local_ranks=4)
    # 4 ranks x ((1.5M + 0.5M) x 128 x 4 B + 240 MB) = 5.06 GB against half of what is available
    assert choose_inference(cfg, available=20e9, **kw) == "full"
    assert choose_inference(cfg, available=10.2e9, **kw) == "full"
    assert choose_inference(cfg, available=10.0e9, **kw) == "layerwise"
    assert choose_inference(SamplerConfig(inference="full"), available=1e9, **kw) == "full"
    assert choose_inference(SamplerConfig(inference="layerwise"), available=1e12, **kw) == "layerwise"


@pytest.mark.timeout(180)
def test_a_layerwise_minibatch_run_predicts_its_own_scores_on_other_rank_counts(tmp_path):
    """Training evaluates layer by layer in chunks of 60 rows; ``predict`` on 3 ranks (new
    partitions, layer-wise too, as the run's config says) and the run's own
    ``predictions.pt`` agree."""
    from commgnn.cli.main import main

    cfg = tmp_path / "small.toml"
    cfg.write_text("[data.synthetic]\nnum_nodes = 400\nnum_classes = 3\nfeature_dim = 8\n")
    run = tmp_path / "run"
    assert main(["train", "--parts", "2", "--epochs", "2", "--hidden", "8", "--mode", "minibatch", "--model", "sage",
                 "--fanout", "5,5", "--batch-size", "64", "--inference", "layerwise", "--inference-chunk", "60",
                 "--quiet", "--no-energy", "--out", str(run), "--config", str(cfg)]) == 0
    assert 'inference = "layerwise"' in (run / "config.toml").read_text()
    out = tmp_path / "p3.pt"
    assert main(["predict", str(run), "--parts", "3", "--out", str(out)]) == 0
    every = torch.load(run / "predictions.pt")
    torch.testing.assert_close(torch.load(out), every, rtol=1e-5, atol=1e-5)
    # one split, on the run's own partitions: the receptive field of its nodes alone
    test_ids = load_dataset(resolve_config(str(run / "config.toml"), {}, {}).data).test_mask.nonzero().flatten()
    assert main(["predict", str(run), "--nodes", "test"]) == 0
    got = torch.load(run / "predictions-run-test.pt", weights_only=True)
    assert test_ids.numel() > 0 and torch.equal(got["nodes"], test_ids)
    reach = got["receptive_rows"].tolist()  # rows each layer computed, the features' first
    assert reach[-1] == test_ids.numel() and reach == sorted(reach, reverse=True) and reach[0] <= 400
    torch.testing.assert_close(got["scores"], every[got["nodes"]], rtol=1e-5, atol=1e-5)
    # ids as given (unordered, repeated), on new partitions for 1 rank
    ids = np.array([399, 5, 17, 5], dtype=np.int32)
    np.save(tmp_path / "ids.npy", ids)
    assert main(["predict", str(run), "--parts", "1", "--nodes", str(tmp_path / "ids.npy"), "--out", str(out)]) == 0
    got = torch.load(out, weights_only=True)
    assert torch.equal(got["nodes"], torch.from_numpy(ids).long())
    torch.testing.assert_close(got["scores"], every[ids], rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A finished one-rank run on a 10-node graph of 2 classes."""
    from commgnn.cli.main import main

    root = tmp_path_factory.mktemp("tiny")
    (root / "tiny.toml").write_text("[data.synthetic]\nnum_nodes = 10\nnum_classes = 2\nfeature_dim = 4\navg_degree = 2.0\n")
    assert main(["train", "--parts", "1", "--epochs", "1", "--hidden", "4", "--quiet", "--no-energy",
                 "--out", str(root / "run"), "--config", str(root / "tiny.toml")]) == 0
    return root / "run"


@pytest.mark.parametrize("nodes,message", [("7,8", "a split (train, val, test) or a .npy file"),
                                           ("ids2d.npy", "1-D array of integer node ids"),
                                           ("far.npy", "id 10 (entry 1) is outside the graph's 10 nodes"),
                                           (None, "predict chosen nodes: --nodes test")])
def test_predict_refuses_bad_nodes_and_scores_that_cannot_fit(tmp_path, tiny_run, monkeypatch, capsys, nodes,
                                                               message):
    """Each bad ``--nodes``, and all of a graph's scores beyond this host's memory, end in
    exit 2 and one line before any rank starts, and write nothing."""
    from commgnn.cli.main import main

    api_predict = importlib.import_module("commgnn.api.predict")

    run = tiny_run
    np.save(tmp_path / "ids2d.npy", np.zeros((2, 2), dtype=np.int64))
    np.save(tmp_path / "far.npy", np.array([0, 10]))
    monkeypatch.setattr(api_predict, "available_bytes", lambda: 50.0)  # 10 x 2 x 4 bytes do not fit in 40
    monkeypatch.setattr(api_predict, "_predict_rank", None)  # no rank may start
    args = ["predict", str(run), "--out", str(tmp_path / "p.pt")]
    assert main(args + (["--nodes", str(tmp_path / nodes) if nodes.endswith(".npy") else nodes] if nodes else [])) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "p.pt").exists()


@pytest.mark.timeout(120)
def test_half_precision_features_train_as_their_float32_values_at_half_the_fetched_bytes(tmp_path):
    """float16 features (a graph folder's x.npy) stay float16 in a mini-batch rank: each step
    converts the rows it reads, so training equals training on the same values in float32,
    bit for bit, while the fetched rows travel at 2 bytes a value."""
    from commgnn.fetch.config import FetchConfig

    data = small_graph(n=120, m=600)
    data.x = data.x.to(torch.float16)
    wide = data.clone()
    wide.x = data.x.to(torch.float32)
    model, train = mb_ranks.small_cfgs()
    sampler = SamplerConfig(fanout=(4, 4), batch_size=16, inference="layerwise", inference_chunk=17)
    runs = [run_on_ranks(mb_ranks.train_minibatch, 2, mb_ranks.mkdir(tmp_path / name), d, random_parts(120, 2, 4),
                         model, train, sampler, FetchConfig(), 2) for name, d in (("half", data), ("wide", wide))]
    for half, full in zip(*runs):
        for k, v in full["state"].items():
            assert torch.equal(half["state"][k], v), k
        assert [r.val_acc for r in half["results"]] == [r.val_acc for r in full["results"]]
        assert 0 < half["sent"]["fetch_rows"] * 2 <= full["sent"]["fetch_rows"] + 8 * 2 * 2


@pytest.mark.timeout(180)
@pytest.mark.parametrize("P,topology,fanout", [(1, "replicated", (-1, -1)), (2, "replicated", (-1, -1)),
                                               (2, "partitioned", (2, 2))])
def test_sampled_evaluation(tmp_path, P, topology, fanout):
    """``minibatch.inference = "sampled"`` scores each split's nodes by neighbour sampling:
    with every neighbour drawn (fan-out -1) that is the exact evaluation; with a fan-out it
    is an estimate that repeats itself for the same weights; either way training is not
    disturbed (the same weights as with exact evaluation: the shared streams are put back)."""
    data = small_graph(n=90, m=500)
    model = ModelConfig(name="sage", hidden=6, layers=2, dropout=0.3)
    res = run_on_ranks(mb_ranks.sampled_against_exact, P, tmp_path, data, random_parts(90, P, 3), model,
                       TrainConfig(epochs=2, lr=0.05, seed=2), topology, fanout)
    for r in res:
        for k, w in r["full"]["weights"].items():
            assert torch.equal(w, r["sampled"]["weights"][k]), k
        counts = r["sampled"]["counts"]
        assert torch.equal(counts[-1], r["sampled"]["again"])  # a fixed stream: the same estimate
        assert bool((counts <= r["masks"]).all())
    if fanout[0] == -1:
        for r in res:
            assert torch.equal(r["sampled"]["counts"], r["full"]["counts"])
    else:  # an estimate, not a copy of the exact counts, over the ranks
        exact = sum(r["full"]["counts"] for r in res)
        est = sum(r["sampled"]["counts"] for r in res)
        assert bool((est - exact).abs().max() <= 0.5 * sum(r["masks"] for r in res).max())


@pytest.mark.timeout(120)
def test_sampled_evaluation_of_a_subset(tmp_path):
    """``minibatch.eval_nodes = k`` scores a fixed ``ceil(k n_r / n)`` of each rank's ``n_r``
    nodes of a split larger than k and scales the correct ones up to the split: with every
    neighbour drawn, each count is the exact hits on those rows times ``n_r / m_r``."""
    data = small_graph(n=90, m=500)
    model = ModelConfig(name="sage", hidden=6, layers=2)
    res = run_on_ranks(mb_ranks.sampled_subset, 2, tmp_path, data, random_parts(90, 2, 3), model,
                       TrainConfig(epochs=1, lr=0.05, seed=3), 10)
    totals = sum(r["masks"] for r in res)
    for r in res:
        assert torch.equal(r["counts"], r["again"])  # the same rows every evaluation
        for s, rows in enumerate(r["rows"]):
            owned = int(r["masks"][s])
            if totals[s] > 10:
                assert rows.numel() == min(owned, math.ceil(10 * owned / float(totals[s])))
            else:
                assert rows.numel() == owned
            hits = float((r["pred"][rows] == r["y"][rows]).sum())
            assert float(r["counts"][s]) == pytest.approx(hits * owned / max(rows.numel(), 1))
        assert r["log"]["eval_scored_nodes"] == [int(v) for v in r["scored"]]
    scored = res[0]["scored"]
    assert all(10 <= scored[s] <= 11 if totals[s] > 10 else scored[s] == totals[s] for s in range(3))


def test_eval_nodes_needs_sampled_inference():
    with pytest.raises(ConfigError, match="eval_nodes = 5 subsamples the splits of a sampled evaluation"):
        SamplerConfig(eval_nodes=5)
    with pytest.raises(ConfigError, match="minibatch.eval_nodes must be >= 0"):
        SamplerConfig(eval_nodes=-1, inference="sampled")


def test_sampled_inference_needs_the_neighbor_sampler():
    with pytest.raises(ConfigError, match="inference = 'sampled' draws neighbours as the neighbor sampler"):
        SamplerConfig(sampler="cluster", inference="sampled")
    with pytest.raises(ConfigError, match="minibatch.inference must be one of"):
        SamplerConfig(inference="exact")
