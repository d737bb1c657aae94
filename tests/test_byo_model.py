"""Bring-your-own model: a user's PyG model runs partition-parallel, equal to one process.

For GCNConv, SAGEConv, GATConv (2 heads), GINConv (with an MLP), GraphConv, GATv2Conv and
TransformerConv (plus GCNConv variants and PyG's own ``GraphSAGE`` model), a small user
model (3 layers, ReLU/ELU, a LayerNorm and a residual add) is run by
:class:`commgnn.models.byo.DistributedModel` at P = 1, 2, 4 on a random partition (most
nodes are boundary nodes) of a graph with some self loops, in float64. Logits (gathered
into global order) and parameter gradients (summed over ranks; loss = sum over owned
train nodes / global train count, as in the trainer) match the single-process model to
1e-5. One spawn per world size checks every layer type; P = 2 also checks that an 8-bit
quantized exchange is close but not exact and sends fewer bytes.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.data import Data
from torch_geometric.nn import LayerNorm as PygLayerNorm
from torch_geometric.nn import (APPNP, MLP, BatchNorm, ChebConv, GATConv, GATv2Conv, GCNConv, GINConv, GraphConv,
                                GraphSAGE, SAGEConv, TransformerConv)

from commgnn.comm.build import build_halo
from commgnn.comm.config import HaloConfig
from commgnn.comm.halo.alltoall import AllToAllHalo
from commgnn.distributed.context import DistContext
from commgnn.distributed.events import CommEvent, Hooks
from commgnn.errors import ConfigError
from commgnn.models.byo import DistributedModel, UnsupportedLayerError
from commgnn.models.graph import LocalGraph
from commgnn.partition import PartitionConfig, assign_parts, build_local_partition
from commgnn.partition.local import LocalPartition
from helpers import run_on_ranks, small_graph

TOL = 1e-5
F_IN, HID, C = 12, 8, 3


class UserNet(nn.Module):
    """conv -> ReLU -> LayerNorm -> (+ residual ELU(conv)) -> conv."""

    def __init__(self, make: Callable[[int, int, bool], nn.Module]) -> None:
        super().__init__()
        self.conv1 = make(F_IN, HID, False)
        self.norm = nn.LayerNorm(HID)
        self.conv2 = make(HID, HID, False)
        self.conv3 = make(HID, C, True)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        h = self.norm(F.relu(self.conv1(x, edge_index)))
        h = h + F.elu(self.conv2(h, edge_index))
        return self.conv3(h, edge_index)


def _gin(a: int, b: int, last: bool) -> nn.Module:
    mlp = nn.Sequential(nn.Linear(a, b), nn.ReLU(), nn.Linear(b, b)) if not last else MLP([a, b, b], norm=None)
    return GINConv(mlp, train_eps=True)


MAKERS: dict[str, Callable[[int, int, bool], nn.Module]] = {
    "gcn": lambda a, b, last: GCNConv(a, b),
    "sage": lambda a, b, last: SAGEConv(a, b),
    "gat": lambda a, b, last: GATConv(a, b, heads=2, concat=False) if last else GATConv(a, b // 2, heads=2),
    "gin": _gin,
    "graph": lambda a, b, last: GraphConv(a, b, aggr="mean" if last else "add"),
    "gatv2": lambda a, b, last: GATv2Conv(a, b // 2, heads=2) if not last else GATv2Conv(a, b, concat=False),
    "transformer": lambda a, b, last: TransformerConv(a, b // 2, heads=2, beta=last) if not last
    else TransformerConv(a, b, heads=2, concat=False),
    "gcn_noloops": lambda a, b, last: GCNConv(a, b, add_self_loops=last),
    "gcn_improved": lambda a, b, last: GCNConv(a, b, improved=True, normalize=not last),
}
TRANSFORM_FIRST = {"gcn_tf"}  # GCN, exchanging conv.lin(h) where it narrows (layers 1 and 3)


def build(kind: str) -> nn.Module:
    torch.manual_seed(7)
    if kind == "pyg_sage":  # PyG's own model class, unmodified
        return GraphSAGE(F_IN, HID, num_layers=3, out_channels=C, act="elu").double()
    return UserNet(MAKERS["gcn" if kind == "gcn_tf" else kind]).double()


KINDS = [*MAKERS, "gcn_tf", "pyg_sage"]


def graph_data() -> Data:
    """small_graph plus self loops on nodes 0..9 (node 3 twice): GCN and GAT must treat
    existing loops as PyG does."""
    data = small_graph(n=60, m=240, f=F_IN, c=C)
    loops = torch.tensor([list(range(10)) + [3]] * 2)
    data.edge_index = torch.cat([data.edge_index, loops], dim=1)
    data.x = data.x.double()
    return data


def loss_fn(logits: Tensor, y: Tensor, mask: Tensor, n_train: int) -> Tensor:
    return F.cross_entropy(logits[mask], y[mask], reduction="sum") / n_train


def reference(data: Data, kind: str) -> dict[str, Any]:
    model = build(kind)
    state = copy.deepcopy(model.state_dict())
    logits = model(data.x, data.edge_index)
    loss_fn(logits, data.y, data.train_mask, int(data.train_mask.sum())).backward()
    return {"state": state, "logits": logits.detach(),
            "grads": {n: p.grad.clone() for n, p in model.named_parameters()}}


def local_graph(part: LocalPartition) -> LocalGraph:
    return LocalGraph(num_own=part.num_owned, num_src=part.num_owned + part.num_halo,
                      edge_index=part.edge_index, in_degree=part.in_degree)


def plan_of(part: LocalPartition):
    from commgnn.comm.halo.protocol import HaloPlan
    return HaloPlan(send_index=part.send_index, send_counts=list(part.send_counts),
                    recv_counts=list(part.recv_counts))


def _halo_bytes(hooks: Hooks) -> list[int]:
    total = [0]

    def count(ev: Any) -> None:
        if isinstance(ev, CommEvent) and ev.kind in ("halo_fwd", "halo_bwd"):
            total[0] += ev.nbytes
    hooks.subscribe(count)
    return total


def byo_rank(ctx: DistContext, data: Data, parts: Tensor, states: dict[str, Any], quantized: bool = False) -> dict:
    """Every model kind on this rank; optionally the 8-bit lever on the SAGE model."""
    part = build_local_partition(data, parts, ctx.world_size, ctx.rank)
    graph = local_graph(part)
    n_train = int(data.train_mask.sum())
    x = part.x.double()
    hooks = Hooks()
    exact_bytes = _halo_bytes(hooks)
    halo = AllToAllHalo(ctx, plan_of(part), hooks)
    out: dict[str, Any] = {"ids": part.global_ids, "n_halo": part.num_halo}
    for kind in KINDS:
        user = build(kind)
        user.load_state_dict(states[kind])
        dm = DistributedModel(user, transform_first=kind in TRANSFORM_FIRST)
        dm.setup(graph, halo)
        logits = dm(x, graph, halo)
        loss_fn(logits, part.y, part.train_mask, n_train).backward()
        out[kind] = {"logits": logits.detach(), "grads": {n: p.grad.clone() for n, p in user.named_parameters()}}
    if quantized:
        results = {}
        for name, cfg in (("exact", None), ("q8", HaloConfig(bits=8))):
            qhooks = Hooks()
            nbytes = _halo_bytes(qhooks)
            ex = AllToAllHalo(ctx, plan_of(part), qhooks) if cfg is None else \
                build_halo(ctx, plan_of(part), qhooks, cfg, num_layers=3, seed=0)
            user = build("sage")
            user.load_state_dict(states["sage"])
            dm = DistributedModel(user)
            logits = dm(x, graph, ex)
            loss_fn(logits, part.y, part.train_mask, n_train).backward()
            results[name] = {"logits": logits.detach(), "bytes": nbytes[0]}
        out["quantized"] = results
        try:  # GCN's one-time degree exchange is refused through a lossy exchange
            DistributedModel(build("gcn"))(x, local_graph(part), build_halo(ctx, plan_of(part), Hooks(),
                                                                            HaloConfig(bits=8), num_layers=3, seed=0))
            out["lossy_setup"] = "no error"
        except RuntimeError as e:
            out["lossy_setup"] = str(e)
    out["exact_bytes"] = exact_bytes[0]
    return out


def _check(data: Data, refs: dict[str, Any], per_rank: list[dict], errors: dict[str, float] | None = None) -> None:
    for kind in KINDS:
        ref = refs[kind]
        logits = torch.full_like(ref["logits"], float("nan"))
        for res in per_rank:
            logits[res["ids"]] = res[kind]["logits"]
        err = float((logits - ref["logits"]).abs().max())
        torch.testing.assert_close(logits, ref["logits"], atol=TOL, rtol=0, msg=f"{kind} logits")
        for n, g in ref["grads"].items():
            total = sum(res[kind]["grads"][n] for res in per_rank)
            err = max(err, float((total - g).abs().max()))
            torch.testing.assert_close(total, g, atol=TOL, rtol=0, msg=f"{kind} grad {n}")
        if errors is not None:
            errors[kind] = err


@pytest.fixture(scope="module")
def setup_refs() -> tuple[Data, dict[str, Any]]:
    data = graph_data()
    return data, {kind: reference(data, kind) for kind in KINDS}


def _parts(data: Data, P: int) -> Tensor:
    return assign_parts(data.edge_index, data.num_nodes, P, PartitionConfig(method="random", seed=1))


def test_exact_single_rank(setup_refs) -> None:
    data, refs = setup_refs
    parts = torch.zeros(data.num_nodes, dtype=torch.long)
    states = {k: r["state"] for k, r in refs.items()}
    _check(data, refs, [byo_rank(DistContext.single(), data, parts, states)])


@pytest.mark.parametrize("P", [2, 4])
def test_exact_multi_rank(setup_refs, tmp_path, P: int) -> None:
    data, refs = setup_refs
    states = {k: r["state"] for k, r in refs.items()}
    per_rank = run_on_ranks(byo_rank, P, tmp_path, data, _parts(data, P), states, P == 2)
    assert all(r["n_halo"] > 0 for r in per_rank)
    errors: dict[str, float] = {}
    _check(data, refs, per_rank, errors)
    print(f"P={P} max abs error (logits, grads):", {k: f"{v:.1e}" for k, v in errors.items()})
    if P == 2:  # the 8-bit lever: close, not exact, fewer bytes
        ex = torch.cat([r["quantized"]["exact"]["logits"] for r in per_rank])
        q8 = torch.cat([r["quantized"]["q8"]["logits"] for r in per_rank])
        diff = float((ex - q8).abs().max())
        assert 0 < diff < 0.05 * float(ex.abs().max())
        assert all("setup(graph, exact_halo)" in r["lossy_setup"] for r in per_rank)
        assert sum(r["quantized"]["q8"]["bytes"] for r in per_rank) < \
            sum(r["quantized"]["exact"]["bytes"] for r in per_rank) / 3


# ---- wrap-time checks (one process) ----------------------------------------------------

class OneLayer(nn.Module):
    def __init__(self, conv: nn.Module, extra: nn.Module | None = None) -> None:
        super().__init__()
        self.conv = conv
        self.extra = extra if extra is not None else nn.Identity()

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.conv(self.extra(x), edge_index)


@pytest.mark.parametrize("conv,name", [(ChebConv(4, 4, K=2), "ChebConv"), (APPNP(K=2, alpha=0.1), "APPNP")])
def test_unsupported_layer_is_named(conv: nn.Module, name: str) -> None:
    with pytest.raises(UnsupportedLayerError, match=name) as info:
        DistributedModel(OneLayer(conv))
    assert "GCNConv" in str(info.value) and "SAGEConv" in str(info.value)
    assert isinstance(info.value, ConfigError)


def test_unsupported_settings_and_norms() -> None:
    class MySAGE(SAGEConv):
        pass
    with pytest.raises(UnsupportedLayerError, match="subclass of SAGEConv"):
        DistributedModel(OneLayer(MySAGE(4, 4)))
    with pytest.raises(UnsupportedLayerError, match="edge_dim"):
        DistributedModel(OneLayer(GATConv(4, 4, edge_dim=2)))
    with pytest.raises(UnsupportedLayerError, match="BatchNorm"):
        DistributedModel(OneLayer(GCNConv(4, 4), BatchNorm(4)))
    with pytest.raises(UnsupportedLayerError, match="BatchNorm"):  # PyG MLP's default norm
        DistributedModel(OneLayer(GINConv(MLP([4, 4, 4]))))
    with pytest.raises(UnsupportedLayerError, match="LayerNorm"):  # PyG LayerNorm's default mode="graph"
        DistributedModel(OneLayer(GCNConv(4, 4), PygLayerNorm(4)))
    DistributedModel(OneLayer(GCNConv(4, 4), PygLayerNorm(4, mode="node")))  # row-wise: accepted
    DistributedModel(GCNConv(4, 4))  # a bare layer is a model too
    with pytest.warns(UserWarning, match="statistics over nodes"):
        DistributedModel(OneLayer(GCNConv(4, 4), nn.BatchNorm1d(4)), nonlocal_norm="warn")
    with pytest.raises(UnsupportedLayerError, match="no torch_geometric MessagePassing"):
        DistributedModel(nn.Linear(3, 3))


def _single(data: Data) -> tuple[LocalGraph, AllToAllHalo, Tensor]:
    parts = torch.zeros(data.num_nodes, dtype=torch.long)
    part = build_local_partition(data, parts, 1, 0)
    return local_graph(part), AllToAllHalo(DistContext.single(), plan_of(part), Hooks()), part.x.double()


def test_user_module_unchanged() -> None:
    """state_dict keys equal the plain model's; no attribute is left behind, also after an
    error inside the forward; edge tensors passed at call time are refused."""
    data = graph_data()
    graph, halo, x = _single(data)
    plain = build("gat")
    user = copy.deepcopy(plain)
    dm = DistributedModel(user)
    dm(x, graph, halo)
    assert list(dm.module.state_dict()) == list(plain.state_dict())
    assert list(dm.state_dict()) == [f"module.{k}" for k in plain.state_dict()]
    assert all("forward" not in m.__dict__ for m in user.modules())

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = SAGEConv(F_IN, F_IN)

        def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
            return self.conv(self.conv(x, edge_index), edge_index)
    twice = Twice().double()
    with pytest.raises(ConfigError, match="called twice"):
        DistributedModel(twice)(x, graph, halo)
    assert "forward" not in twice.conv.__dict__
    assert twice.conv(x, graph.edge_index).shape == x.shape  # plain PyG again

    class Weighted(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = GCNConv(F_IN, 2)

        def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
            return self.conv(x, edge_index, torch.ones(edge_index.shape[1], dtype=x.dtype))
    with pytest.raises(ConfigError, match="edge_weight"):
        DistributedModel(Weighted().double())(x, graph, halo)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert DistributedModel(build("gin")).num_layers == 3
