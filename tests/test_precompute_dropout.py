"""``comm.halo.precompute_dropout``: dropout on a precomputed first-layer aggregate.

The exact model's first layer sees ``A dropout(X)``; ``precompute`` keeps ``A X`` and, by
default (``"aggregate"``), drops its entries, whose per-entry variance is up to degree-times
larger. ``"matched"`` adds noise with the exact model's per-entry mean and variance. Monte
Carlo checks of both, on the dense and the sparse-input paths, for GCN and SAGE."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from commgnn.comm.config import HaloConfig
from commgnn.comm.halo.alltoall import AllToAllHalo
from commgnn.distributed.context import DistContext
from commgnn.distributed.events import Hooks
from commgnn.errors import ConfigError
from commgnn.models import ModelConfig
from commgnn.models.graph import spmm
from commgnn.models.net import PartitionGNN
from commgnn.partition import build_local_partition
from commgnn.trainers.fullgraph import halo_plan, local_graph
from helpers import small_graph

P, DRAWS = 0.5, 2000


def _setup(name: str, sparse: bool, dropout: str, signed: bool = False) -> tuple[PartitionGNN, Tensor, Tensor, Tensor]:
    """A one-process model on a graph with 30%-dense features, non-negative or (``signed``)
    in {-1, 1}, whose means often cancel to 0 where the noise does not (sparse inputs use the
    pattern path), precomputed with ``dropout``; also ``x``, ``A X`` and the exact model's
    per-entry variance of ``A dropout(X)`` (Monte Carlo)."""
    data = small_graph(n=40, m=300, f=6, seed=3)
    g = torch.Generator().manual_seed(1)
    keep = torch.rand(40, 6, generator=g) < 0.3
    data.x = (torch.randint(0, 2, (40, 6), generator=g) * 2.0 - 1.0 if signed else torch.rand(40, 6, generator=g)) * keep
    part = build_local_partition(data, torch.zeros(40, dtype=torch.long), 1, 0)
    graph = local_graph(part)
    halo = AllToAllHalo(DistContext.single(), halo_plan(part), Hooks())
    x = part.x.double()
    model = PartitionGNN(ModelConfig(name=name, layers=2, hidden=6, dropout=P), 6, 3).double()
    model.precompute(x, graph, halo, dropout=dropout)
    if sparse:
        model.use_sparse_input(x, halo)
    adj = model.convs[0].aggregation(graph, torch.float64)
    exact = spmm(adj, F.dropout(x.repeat(1, DRAWS), P, True)).view(-1, DRAWS, x.shape[1])  # one draw per block
    return model, x, spmm(adj, x), exact.var(1)


def _graph():
    return local_graph(build_local_partition(small_graph(n=40, m=300, f=6, seed=3),
                                             torch.zeros(40, dtype=torch.long), 1, 0))


def _noisy_inputs(model: PartitionGNN, x: Tensor) -> Tensor:
    """``DRAWS`` training-mode draws of the first layer's aggregate input: what its weight
    multiplies (read through the layer's projector with the identity)."""
    conv = model.convs[0]
    seen: list[Tensor] = []
    real = conv.from_precomputed

    def capture(pre, x_own, graph, proj_pre=None, proj_own=None):
        seen.append(proj_pre(pre, torch.eye(pre.shape[1], dtype=pre.dtype)) if proj_pre is not None else pre)
        return real(pre, x_own, graph) if proj_pre is None else real(pre, x_own, graph, proj_pre, proj_own)

    conv.from_precomputed = capture
    model.train()
    graph = _graph()
    for _ in range(DRAWS):
        model(x, graph, _NoHalo(), upto=0)  # the first layer only: no exchange
    del conv.from_precomputed
    return torch.stack(seen)


class _NoHalo:
    def exchange(self, *_a, **_k):  # upto=0 stops before any exchange
        raise AssertionError("layer 0 under precompute must not exchange")


@pytest.mark.parametrize("name, signed", [("gcn", False), ("sage", False), ("sage", True)])
# the sparse-feature cases are slow (CI time, 6-9 s each): the dense ones check the same moments
@pytest.mark.parametrize("sparse", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_matched_noise_has_the_exact_models_mean_and_variance(name, signed, sparse):
    """Mean A X and per-entry variance within 10% of the exact model's (2000 draws of each;
    the entries with noise, including those whose mean cancels to 0: the sparse pattern is
    the union of both). ``aggregate``'s is about 3x the exact one on this graph."""
    torch.manual_seed(0)
    model, x, ax, exact_var = _setup(name, sparse, "matched", signed)
    draws = _noisy_inputs(model, x)
    noisy = exact_var > 1e-4
    assert noisy.sum() > 50
    assert not signed or (noisy & (ax == 0)).sum() > 10
    se = (exact_var / DRAWS).sqrt()
    assert ((draws.mean(0) - ax).abs() <= 5 * se + 1e-9).all()
    ratio = draws.var(0)[noisy] / exact_var[noisy]
    assert 0.9 < ratio.mean() < 1.1 and ratio.min() > 0.75 and ratio.max() < 1.3

    if not signed:
        torch.manual_seed(0)
        old, x, ax, exact_var = _setup(name, sparse, "aggregate")
        ratio_old = _noisy_inputs(old, x).var(0)[noisy] / exact_var[noisy]
        assert ratio_old.mean() > 2.0


def test_matched_is_refused_for_gat_and_without_precompute():
    with pytest.raises(ConfigError, match="precompute = true"):
        HaloConfig(precompute_dropout="matched")
    with pytest.raises(ConfigError, match="'aggregate' or 'matched'"):
        HaloConfig(precompute=True, precompute_dropout="none")
    part = build_local_partition(small_graph(), torch.zeros(60, dtype=torch.long), 1, 0)
    halo = AllToAllHalo(DistContext.single(), halo_plan(part), Hooks())
    gat = PartitionGNN(ModelConfig(name="gat", layers=2, hidden=8, heads=2), 8, 3)
    with pytest.raises(ConfigError, match="GAT"):
        gat.precompute(part.x, local_graph(part), halo, dropout="matched")


def test_matched_noise_leaves_evaluation_exact():
    """In eval mode both settings give the exact model's output."""
    model, x, _, _ = _setup("gcn", True, "matched")
    ref, _, _, _ = _setup("gcn", True, "aggregate")
    ref.load_state_dict(model.state_dict())
    graph = _graph()
    model.eval(), ref.eval()
    assert torch.equal(model(x, graph, _NoHalo(), upto=0), ref(x, graph, _NoHalo(), upto=0))


def test_the_trainer_and_the_run_config_pass_the_setting_on():
    """``comm.halo.precompute_dropout`` reaches the model (its sigma is kept only when
    matched); a GAT run config with matched is refused before anything starts."""
    from commgnn.runner.config import RunConfig
    from commgnn.comm.config import CommConfig
    from commgnn.trainers import TrainConfig
    from commgnn.trainers.fullgraph import FullGraphTrainer

    part = build_local_partition(small_graph(), torch.zeros(60, dtype=torch.long), 1, 0)
    for mode in ("aggregate", "matched"):
        comm = CommConfig(halo=HaloConfig(precompute=True, precompute_dropout=mode))
        t = FullGraphTrainer(DistContext.single(), part, ModelConfig(name="sage", hidden=8),
                             TrainConfig(epochs=1, patience=0), Hooks(), comm_cfg=comm)
        assert (t.model.pre_sigma is not None or t.model.sparse_sigma is not None) == (mode == "matched")
    with pytest.raises(ConfigError, match="GAT"):
        RunConfig(model=ModelConfig(name="gat"),
                  comm=CommConfig(halo=HaloConfig(precompute=True, precompute_dropout="matched")))


def test_the_flag_maps_to_the_config_key():
    from commgnn.runner.config import resolve_config

    cfg = resolve_config(None, {"precompute": True, "precompute_dropout": "matched"}, {})
    assert cfg.comm.halo.precompute_dropout == "matched"
    with pytest.raises(ConfigError, match="precompute = true"):
        resolve_config(None, {"precompute_dropout": "matched"}, {})
