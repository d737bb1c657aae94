"""VR-GCN's estimator with dropout (CVD): Monte Carlo checks of its mean and variance on a
star, and the history it keeps. The estimator is in :mod:`commgnn.models.vrgcn`."""

from __future__ import annotations

import pytest
import torch

from commgnn.distributed.context import DistContext
from commgnn.distributed.events import Hooks
from commgnn.fetch.config import FetchConfig
from commgnn.models import ModelConfig
from commgnn.models.blocks import BlockGraph
from commgnn.models.dropout import dropout
from commgnn.models.graph import spmm
from commgnn.models.vrgcn import control_variate, dropout_noise
from commgnn.partition import build_local_partition
from commgnn.sampling.base import Block
from commgnn.sampling.config import SamplerConfig
from commgnn.sampling.vrgcn import HistoryEdges
from commgnn.trainers import TrainConfig
from commgnn.trainers.minibatch import MiniBatchTrainer
from helpers import small_graph

DIM, P = 4, 0.5
"""Rows of DIM, dropout P."""


def _star_draws(mu: torch.Tensor, table: torch.Tensor, k: int, replace: bool,
                draws: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``draws`` independent draws, as one block, of (VR-GCN's aggregate at a star's centre,
    the exact aggregate of the dropped-out rows). ``mu: [d, DIM]`` the d neighbours' rows,
    ``table`` their history, k of them sampled (with or without replacement). Draw t's
    centre is source t (destinations are a prefix of the sources), its neighbour j source
    ``draws + t * d + j``."""
    d = mu.shape[0]
    n = draws * (d + 1)
    rows = torch.cat([torch.zeros(draws, DIM, dtype=mu.dtype), mu.repeat(draws, 1)])
    hist = torch.cat([torch.zeros(draws, DIM, dtype=mu.dtype), table.repeat(draws, 1)])
    hd = dropout(rows, P, True)  # dropout draws from the global generator: seeded by the caller
    base = draws + torch.arange(draws)[:, None] * d
    pick = torch.randint(0, d, (draws, k)) if replace else torch.rand(draws, d).argsort(1)[:, :k]
    dst = torch.arange(draws).repeat_interleave(k)
    block = Block(edge_index=torch.stack([(base + pick).reshape(-1), dst]), num_src=n, num_dst=draws,
                  weight=torch.full((draws * k,), 1.0 / k, dtype=torch.float64))
    full = HistoryEdges(src=(base + torch.arange(d)).reshape(-1), dst=torch.arange(draws).repeat_interleave(d),
                        weight=torch.full((draws * d,), 1.0 / d, dtype=torch.float64))
    mean = BlockGraph(block).mean_adj(mu.dtype)
    agg = (control_variate(mean, full, hist, torch.arange(n), rows)
           + dropout_noise(mean, block, full, hd, rows, replace))
    return agg, hd[draws:].view(draws, d, DIM).mean(1)


@pytest.mark.parametrize("d, k, replace", [(36, 2, False), (36, 2, True), (3, 5, True)])
def test_vrgcn_dropout_estimator_is_unbiased_with_the_exact_dropout_variance(d, k, replace):
    """E[agg] = mean of the neighbours' mu whatever the history holds, and with a converged
    history (hbar = mu) the variance of agg equals that of the exact aggregate of the
    dropped-out rows: averaging the noise of k = 2 of 36 rows alone would be 18x larger
    (and draws with replacement, repeats sharing their noise, need their own scale)."""
    torch.manual_seed(0)
    mu = torch.rand(d, DIM, dtype=torch.float64) + 0.5
    target = mu.mean(0)
    for table, max_ratio in ((mu.clone(), 1.25), (torch.zeros_like(mu), None)):
        est, exact = _star_draws(mu, table, k, replace, 6000)
        se = est.std(0) / est.shape[0] ** 0.5
        assert ((est.mean(0) - target).abs() < 4 * se).all(), (est.mean(0), target)
        if max_ratio is not None:
            ratio = est.var(0) / exact.var(0)
            assert ((ratio > 1 / max_ratio) & (ratio < max_ratio)).all(), ratio


def test_vrgcn_with_every_neighbour_is_the_exact_forward_with_the_same_dropout():
    """Fan-out -1 (every neighbour, s = 1): whatever the history holds, the 3-layer VR-GCN
    forward with dropout equals GraphSAGE on the exact means of the same dropped-out rows
    (the same dropout draws: layer 0's root term, then each layer's input)."""
    data = small_graph(n=60, m=300)
    part = build_local_partition(data, torch.zeros(60, dtype=torch.long), 1, 0)
    t = MiniBatchTrainer(DistContext.single(), part, ModelConfig(name="sage", layers=3, hidden=6, dropout=0.5),
                         TrainConfig(epochs=1), Hooks(),
                         sampler_cfg=SamplerConfig(sampler="vrgcn", fanout=(-1, -1, -1), batch_size=10),
                         fetch_cfg=FetchConfig())
    batch = t.sampler.sample(part.global_ids[part.train_mask][:10], torch.Generator().manual_seed(0))
    rows = t.fetcher.fetch(batch.nodes)
    for layer in (1, 2):
        t.history[layer].copy_(torch.randn_like(t.history[layer]))  # arbitrary, far from mu
    t.net.train()
    torch.manual_seed(3)
    out = t.net(rows, batch)
    torch.manual_seed(3)
    convs, f, n1 = t.model.convs, data.x.shape[1], batch.blocks[0].num_dst
    h = torch.relu(convs[0].from_precomputed(rows[:n1, f:], dropout(rows[:n1, :f], P, True), None))
    for i in (1, 2):
        block = batch.blocks[i]
        hd = dropout(h, P, True)
        h = convs[i].lin_l(spmm(BlockGraph(block).mean_adj(h.dtype), hd)) + convs[i].lin_r(hd[: block.num_dst])
        h = torch.relu(h) if i < 2 else h
    assert torch.allclose(out, h, atol=1e-5)


def _two_layer_batch() -> tuple:
    """A 2-layer VR-GCN trainer (dropout 0.5, fan-out 2,2) on a small graph, one batch of
    10 seeds and its fetched ``[x | mean_N x]`` rows."""
    data = small_graph(n=60, m=300)
    part = build_local_partition(data, torch.zeros(60, dtype=torch.long), 1, 0)
    t = MiniBatchTrainer(DistContext.single(), part, ModelConfig(name="sage", layers=2, hidden=6, dropout=0.5),
                         TrainConfig(epochs=1), Hooks(),
                         sampler_cfg=SamplerConfig(sampler="vrgcn", fanout=(2, 2), batch_size=10),
                         fetch_cfg=FetchConfig())
    batch = t.sampler.sample(part.global_ids[part.train_mask][:10], torch.Generator().manual_seed(0))
    return data, t, batch, t.fetcher.fetch(batch.nodes)


def test_vrgcn_history_holds_the_activations_without_dropout():
    """With dropout, the history stores the no-dropout activations (the mean the control
    variate subtracts), not the dropped-out rows the step trained on."""
    data, t, batch, rows = _two_layer_batch()
    t.net.train()
    t.net(rows, batch)
    conv0, n1, f = t.model.convs[0], batch.blocks[0].num_dst, data.x.shape[1]
    mu1 = torch.relu(conv0.from_precomputed(rows[:n1, f:], rows[:n1, :f], None)).detach()
    assert (mu1 != 0).any()
    assert torch.allclose(t.history[1][batch.nodes[:n1]], mu1, atol=1e-6)


def test_vrgcn_first_layer_keeps_the_precomputed_mean_free_of_dropout():
    """Layer 0 gets ``pre = mean_N x`` as it is (dropping the mean itself would put a whole
    row's noise on it, d times the full-batch noise) and ``x`` with dropout."""
    data, t, batch, rows = _two_layer_batch()
    seen = []
    conv0 = t.model.convs[0]
    real = conv0.from_precomputed
    conv0.from_precomputed = lambda pre, x, g: seen.append((pre, x)) or real(pre, x, g)
    t.net.train()
    t.net(rows, batch)
    n1, f = batch.blocks[0].num_dst, data.x.shape[1]
    (pre_h, x_h), (pre_mu, x_mu) = seen  # the dropout stream, then the mean stream
    assert torch.equal(pre_h, rows[:n1, f:]) and torch.equal(pre_mu, rows[:n1, f:])
    assert torch.equal(x_mu, rows[:n1, :f]) and not torch.equal(x_h, rows[:n1, :f])
