"""Adapt-then-combine D-PSGD: with exact averaging it is the all-reduce, step for step."""

from __future__ import annotations

import torch

from commgnn.comm.config import CommConfig, GossipConfig
from commgnn.comm.gossip.dpsgd import DPSGDAdaptThenCombine
from commgnn.data import SyntheticConfig, make_csbm
from commgnn.distributed.context import DistContext
from commgnn.distributed.events import CommEvent, Hooks
from commgnn.models import ModelConfig
from commgnn.partition import PartitionConfig, assign_parts, build_local_partition
from commgnn.trainers import FullGraphTrainer, TrainConfig
from helpers import run_on_ranks

EPOCHS = 6


def order_rank(ctx: DistContext, data, parts) -> dict:
    part = build_local_partition(data, parts, ctx.world_size, ctx.rank)
    out = {}
    for name, comm in {"allreduce": CommConfig(),
                       "atc-full": CommConfig(gossip=GossipConfig(topology="full", method="dpsgd-atc")),
                       "cta-full": CommConfig(gossip=GossipConfig(topology="full", method="dpsgd"))}.items():
        counted: list[int] = []
        hooks = Hooks()
        hooks.subscribe(lambda e: counted.append(e.nbytes) if isinstance(e, CommEvent) and e.kind == "grad_sync" else None)
        # SGD with momentum and dropout: the update is linear in the gradients, so averaging the
        # P local steps equals the step along the summed gradient
        trainer = FullGraphTrainer(ctx, part, ModelConfig(name="gcn", hidden=16, dropout=0.5),
                                   TrainConfig(epochs=EPOCHS, lr=0.2, optimizer="sgd", momentum=0.9, patience=0),
                                   hooks, comm_cfg=comm)
        losses = [r.loss for r in trainer.run()]
        params = torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()])
        out[name] = {"losses": losses, "params": params, "bytes": sum(counted)}
    return out


def test_adapt_then_combine_with_exact_averaging_is_the_allreduce(tmp_path):
    data = make_csbm(SyntheticConfig(num_nodes=300, num_classes=3, feature_dim=8, avg_degree=6.0,
                                     homophily=0.9, seed=4))
    parts = assign_parts(data.edge_index, data.num_nodes, 3, PartitionConfig(method="metis"))
    res = run_on_ranks(order_rank, 3, tmp_path, data, parts, timeout_s=120)
    for r in res:
        torch.testing.assert_close(r["atc-full"]["params"], res[0]["allreduce"]["params"], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(torch.tensor(r["atc-full"]["losses"]), torch.tensor(r["allreduce"]["losses"]),
                                   rtol=1e-4, atol=1e-5)
    # mix-then-step (Lian et al.) takes each gradient at a model moved by its own rank only
    gap = float((res[0]["cta-full"]["params"] - res[0]["allreduce"]["params"]).abs().max())
    assert gap > 1e-3
    n = res[0]["allreduce"]["params"].numel()
    assert res[0]["atc-full"]["bytes"] == EPOCHS * 2 * n * 4  # the fp32 model to both other ranks


def test_adapt_then_combine_without_peers_is_plain_sgd():
    sync = DPSGDAdaptThenCombine(DistContext.single(), Hooks(), "exponential")
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.full((3,), 2.0)
    sync.sync([p])
    sync.after_step([p])
    assert torch.equal(p.grad, torch.full((3,), 2.0)) and torch.equal(p.detach(), torch.ones(3))
    assert sync.state_dict() == {"round": 0}
