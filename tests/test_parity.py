"""Exactness: the partition-parallel model equals single-process PyG on the whole graph.

For P = 1, 2, 4 ranks and GCN, GraphSAGE (also with LayerNorm) and GAT with the same initial weights: logits,
loss and parameter gradients match PyG's GCNConv / SAGEConv / GATConv to 1e-5 (float64 is
used so that the comparison measures the algorithm, not summation order), and so do the
weights after three Adam steps. A random partition makes most nodes boundary nodes.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from commgnn.comm.config import CommConfig, HaloConfig
from commgnn.comm.halo.exchange import RowExchange
from commgnn.distributed.context import DistContext
from commgnn.distributed.events import Hooks
from commgnn.models import ModelConfig
from commgnn.partition import PartitionConfig, assign_parts, build_local_partition
from commgnn.trainers import FullGraphTrainer, TrainConfig
from helpers import pyg_reference, run_on_ranks, small_graph, trainer_steps

MODELS = ("gcn", "sage", "gat", "sage-norm")  # sage-norm: LayerNorm between layers (model.norm)
STEPS = 3
TOL = 1e-5


def _cfgs(name: str) -> tuple[ModelConfig, TrainConfig]:
    norm = "layer" if name.endswith("-norm") else "none"
    return (ModelConfig(name=name.removesuffix("-norm"), layers=3, hidden=8, heads=2, dropout=0.0, norm=norm),
            TrainConfig(dtype="float64", lr=0.01, epochs=STEPS))


def reference(data, name: str) -> dict:
    """Single-process PyG: initial state, logits, loss, gradients and weights after STEPS."""
    return pyg_reference(data, *_cfgs(name), STEPS)


def parity_rank(ctx: DistContext, data, parts, refs: dict, halo_cfg: HaloConfig | None = None,
                sparse_input: str = "off") -> dict:
    results = {}
    for name in MODELS:
        mcfg, tcfg = _cfgs(name)
        tcfg = replace(tcfg, sparse_input=sparse_input)
        part = build_local_partition(data, parts, ctx.world_size, ctx.rank)
        trainer = FullGraphTrainer(ctx, part, mcfg, tcfg, Hooks(), comm_cfg=CommConfig(halo=halo_cfg or HaloConfig()))
        results[name] = {"ids": part.global_ids, **trainer_steps(ctx, trainer, refs[name]["state"], STEPS)}
    return results


def _check(data, refs: dict, per_rank: list[dict]) -> None:
    for name in MODELS:
        ref = refs[name]
        logits = torch.empty_like(ref["logits"])
        for res in per_rank:
            logits[res[name]["ids"]] = res[name]["logits"]
        torch.testing.assert_close(logits, ref["logits"], atol=TOL, rtol=0)
        assert abs(per_rank[0][name]["loss"] - ref["loss"]) < TOL
        for res in per_rank:  # every rank holds the full gradient after sync
            for n, g in ref["grads"].items():
                torch.testing.assert_close(res[name]["grads"][n], g, atol=TOL, rtol=0, msg=f"{name} {n}")
            for n, w in ref["final"].items():
                torch.testing.assert_close(res[name]["final"][n], w, atol=TOL, rtol=0, msg=f"{name} {n}")


@pytest.fixture(scope="module")
def graph_and_refs():
    data = small_graph(n=60, m=240, f=12)  # 12 -> 8 -> 8 -> 3: transform-first narrows layers 0 and 2
    return data, {name: reference(data, name) for name in MODELS}


def test_parity_single_rank(graph_and_refs):
    data, refs = graph_and_refs
    parts = torch.zeros(data.num_nodes, dtype=torch.long)
    _check(data, refs, [parity_rank(DistContext.single(), data, parts, refs)])


@pytest.mark.parametrize("P", [2, 4])
def test_parity_multi_rank(graph_and_refs, tmp_path, P):
    data, refs = graph_and_refs
    parts = assign_parts(data.edge_index, data.num_nodes, P, PartitionConfig(method="random", seed=1))
    per_rank = run_on_ranks(parity_rank, P, tmp_path, data, parts, refs)
    assert all(len(r["gcn"]["ids"]) > 0 for r in per_rank)
    _check(data, refs, per_rank)


@pytest.mark.parametrize("levers", [
    # CI time: transform-first alone is also checked by test_sparse_input_keeps_parity
    {"transform_first": True},
    # 2-bit rows and a 50% sample, both made to step aside every epoch (exact_every = 1)
    {"precompute": True, "transform_first": True}, {"bits": 2, "sample_rate": 0.5, "exact_every": 1}])
def test_lossless_levers_keep_parity(graph_and_refs, tmp_path, levers):
    """Precomputed layer-1 aggregation, transform-before-aggregate and lossy levers under
    exact guard epochs give the exact model's logits, gradients and updates."""
    data, refs = graph_and_refs
    parts = assign_parts(data.edge_index, data.num_nodes, 3, PartitionConfig(method="random", seed=1))
    _check(data, refs, run_on_ranks(parity_rank, 3, tmp_path, data, parts, refs, HaloConfig(**levers)))


@pytest.mark.parametrize("levers", [{}, {"transform_first": True}, {"precompute": True}])
def test_sparse_input_keeps_parity(tmp_path, levers):
    """Layer-1 products on the input's non-zero pattern equal the dense ones."""
    data = small_graph(n=60, m=240, f=12, seed=5)
    data.x[torch.rand(data.x.shape, generator=torch.Generator().manual_seed(0)) < 0.8] = 0.0
    refs = {name: reference(data, name) for name in MODELS}
    parts = assign_parts(data.edge_index, data.num_nodes, 2, PartitionConfig(method="random", seed=1))
    _check(data, refs, run_on_ranks(parity_rank, 2, tmp_path, data, parts, refs, HaloConfig(**levers), "on"))


def test_parity_detects_a_wrong_halo(graph_and_refs, tmp_path):
    """The comparison can fail: dropping the halo (no exchange) breaks parity."""
    data, refs = graph_and_refs
    parts = assign_parts(data.edge_index, data.num_nodes, 2, PartitionConfig(method="random", seed=1))
    per_rank = run_on_ranks(no_halo_rank, 2, tmp_path, data, parts, refs)
    with pytest.raises(AssertionError):
        _check(data, refs, per_rank)


class ZeroHalo(RowExchange):
    """Pretends nothing crosses the cut: zero rows instead of the peers' halo rows."""

    def __init__(self, n_halo: int) -> None:
        self.n_halo = n_halo

    def exchange(self, h, layer, kind=None):
        return h.new_zeros(self.n_halo, h.shape[1])


def no_halo_rank(ctx: DistContext, data, parts, refs: dict) -> dict:
    part = build_local_partition(data, parts, ctx.world_size, ctx.rank)
    zero_halo = ZeroHalo(part.num_halo)
    results = {}
    for name in MODELS:
        mcfg, tcfg = _cfgs(name)
        trainer = FullGraphTrainer(ctx, part, mcfg, tcfg, Hooks(), halo=zero_halo)
        trainer.model.load_state_dict(refs[name]["state"])
        loss, logits = trainer.compute_gradients()
        results[name] = {"ids": part.global_ids, "logits": logits, "loss": float(ctx.all_reduce(loss.reshape(1))),
                         "grads": {n: p.grad for n, p in trainer.model.named_parameters()},
                         "final": trainer.model.state_dict()}
    return results
