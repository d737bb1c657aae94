"""Deep residual models (``model.residual = "res+"``, issue #15 section 4).

Exactness: a 6-block res+ GCN and SAGE (and a MaxK GCN, whose every message travels as
(index, value) pairs) give PyG's single-process reference's logits, loss, gradients and
weights after three Adam steps to 1e-5 in float64, on one rank and on three gloo ranks of a
random partition, with and without activation checkpointing. Checkpointing is checked on
its own with dropout on (its recomputation must replay the masks) and must not exchange a
second time. The saved-activation estimate equals what autograd keeps. Levers that do not
fit res+ are refused in one line.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from commgnn.runner.config import RunConfig, resolve_config
from commgnn.cli.main import build_parser
from commgnn.comm.config import CommConfig, HaloConfig
from commgnn.distributed.context import DistContext
from commgnn.distributed.events import Hooks
from commgnn.errors import ConfigError
from commgnn.models import LocalGraph, ModelConfig, PartitionGNN, ReferenceGNN
from commgnn.models.deep import ResPlusGNN
from commgnn.models.net import maxk_message_layers
from commgnn.partition import PartitionConfig, assign_parts, build_local_partition
from commgnn.sampling.config import SamplerConfig
from commgnn.trainers import FullGraphTrainer, TrainConfig
from helpers import pyg_reference, run_on_ranks, small_graph, trainer_steps

STEPS = 3
TOL = 1e-5
LAYERS = 6
CASES: dict[str, dict[str, Any]] = {  # (name, activation) -> the reference's key
    "gcn": {"name": "gcn"},
    "sage": {"name": "sage"},
    "gcn-maxk": {"name": "gcn", "activation": "maxk", "maxk_k": 3},
}
RUNS = [(case, ckpt) for case in CASES for ckpt in (False, True)]


def _cfgs(case: str, checkpoint: bool = False) -> tuple[ModelConfig, TrainConfig]:
    mcfg = ModelConfig(layers=LAYERS, hidden=8, dropout=0.0, residual="res+", checkpoint=checkpoint,
                       **CASES[case])
    return mcfg, TrainConfig(dtype="float64", lr=0.01, epochs=STEPS)


def _graph():
    data = small_graph(n=60, m=240, f=12, seed=3)
    data.x[torch.rand(data.x.shape, generator=torch.Generator().manual_seed(1)) < 0.5] = 0.0
    return data


def reference(data, case: str) -> dict:
    """Single-process PyG: initial state, logits, loss, gradients and weights after STEPS."""
    return pyg_reference(data, *_cfgs(case), STEPS)


def parity_rank(ctx: DistContext, data, parts, refs: dict) -> dict:
    results = {}
    part = build_local_partition(data, parts, ctx.world_size, ctx.rank)
    for case, ckpt in RUNS:
        mcfg, tcfg = _cfgs(case, ckpt)
        tcfg = replace(tcfg, sparse_input="on" if ckpt else "off")  # the encoder on the input's pattern
        trainer = FullGraphTrainer(ctx, part, mcfg, tcfg, Hooks(), comm_cfg=CommConfig())
        assert isinstance(trainer.model, ResPlusGNN)
        results[case, ckpt] = {"ids": part.global_ids, **trainer_steps(ctx, trainer, refs[case]["state"], STEPS)}
    return results


def _check(refs: dict, per_rank: list[dict]) -> None:
    for case, ckpt in RUNS:
        ref, what = refs[case], f"{case} checkpoint={ckpt}"
        logits = torch.full_like(ref["logits"], float("nan"))
        for res in per_rank:
            logits[res[case, ckpt]["ids"]] = res[case, ckpt]["logits"]
        torch.testing.assert_close(logits, ref["logits"], atol=TOL, rtol=0, msg=what)
        assert abs(per_rank[0][case, ckpt]["loss"] - ref["loss"]) < TOL, what
        for res in per_rank:  # every rank holds the full gradient after sync
            for n, g in ref["grads"].items():
                torch.testing.assert_close(res[case, ckpt]["grads"][n], g, atol=TOL, rtol=0, msg=f"{what} {n}")
            for n, w in ref["final"].items():
                torch.testing.assert_close(res[case, ckpt]["final"][n], w, atol=TOL, rtol=0, msg=f"{what} {n}")


@pytest.fixture(scope="module")
def graph_and_refs():
    data = _graph()
    return data, {case: reference(data, case) for case in CASES}


def test_res_plus_parity_single_rank(graph_and_refs):
    data, refs = graph_and_refs
    parts = torch.zeros(data.num_nodes, dtype=torch.long)
    _check(refs, [parity_rank(DistContext.single(), data, parts, refs)])


def test_res_plus_parity_three_ranks(graph_and_refs, tmp_path):
    data, refs = graph_and_refs
    parts = assign_parts(data.edge_index, data.num_nodes, 3, PartitionConfig(method="random", seed=1))
    per_rank = run_on_ranks(parity_rank, 3, tmp_path, data, parts, refs)
    assert all(len(r["gcn", False]["ids"]) > 0 for r in per_rank)
    _check(refs, per_rank)


def test_parity_check_detects_a_missing_block(graph_and_refs):
    """The comparison can fail: a model with one block fewer (weights otherwise equal) differs."""
    data, refs = graph_and_refs
    mcfg, _ = _cfgs("gcn")
    short = ResPlusGNN(replace(mcfg, layers=LAYERS - 1), data.x.shape[1], data.num_classes_total).double()
    state = {k: v for k, v in refs["gcn"]["state"].items() if not k.startswith((f"convs.{LAYERS - 1}.",
                                                                                  f"norms.{LAYERS - 1}."))}
    short.load_state_dict(state)
    n = data.num_nodes
    graph = LocalGraph(num_own=n, num_src=n, edge_index=data.edge_index,
                       in_degree=torch.bincount(data.edge_index[1], minlength=n))
    logits = short(data.x.double(), graph, _GatherHalo(torch.zeros(0, dtype=torch.long)))
    assert (logits - refs["gcn"]["logits"]).abs().max() > 100 * TOL


# ---- activation checkpointing, one process with a stand-in halo

class _GatherFn(torch.autograd.Function):
    """Halo rows = owned rows ``idx`` (a differentiable stand-in for a peer's rows)."""

    @staticmethod
    def forward(fctx: Any, h: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        fctx.idx, fctx.n = idx, h.shape[0]
        return h[idx].clone()

    @staticmethod
    def backward(fctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return grad.new_zeros(fctx.n, grad.shape[1]).index_add_(0, fctx.idx, grad), None


class _GatherHalo:
    """Records every exchange's layer and width (forward calls only)."""

    def __init__(self, idx: torch.Tensor) -> None:
        self.idx = idx
        self.calls: list[tuple[int, int]] = []

    def exchange(self, h: torch.Tensor, layer: int, kind: str | None = None) -> torch.Tensor:
        self.calls.append((layer, h.shape[1]))
        return _GatherFn.apply(h, self.idx)


def _local(n_own: int = 50, n_halo: int = 20, seed: int = 0) -> tuple[LocalGraph, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n_own + n_halo, (300,), generator=g)
    dst = torch.randint(0, n_own, (300,), generator=g)
    graph = LocalGraph(num_own=n_own, num_src=n_own + n_halo, edge_index=torch.stack([src, dst]),
                       in_degree=torch.randint(1, 6, (n_own + n_halo,), generator=g))
    return graph, torch.randint(0, n_own, (n_halo,), generator=g)


@pytest.mark.parametrize("name", ["gcn", "sage"])
def test_checkpointing_gives_the_same_gradients_and_exchanges_once(name):
    """Dropout 0.5 (the recomputation must replay its masks), 5 blocks: outputs and every
    gradient agree to 1e-6; each forward exchanges exactly once per block, layers 0..L-1,
    hidden-wide; the recomputation in the backward pass does not exchange again."""
    graph, idx = _local()
    x = torch.randn(50, 7, generator=torch.Generator().manual_seed(1))
    out, grads, calls = {}, {}, {}
    for ckpt in (False, True):
        cfg = ModelConfig(name=name, layers=5, hidden=16, dropout=0.5, residual="res+", checkpoint=ckpt)
        torch.manual_seed(0)
        model = ResPlusGNN(cfg, 7, 3).train()
        halo = _GatherHalo(idx)
        torch.manual_seed(42)
        logits = model(x, graph, halo)
        (logits * torch.linspace(-1, 1, logits.numel()).reshape(logits.shape)).sum().backward()
        out[ckpt], calls[ckpt] = logits.detach(), halo.calls
        grads[ckpt] = {n: p.grad.clone() for n, p in model.named_parameters()}
    torch.testing.assert_close(out[True], out[False], atol=1e-6, rtol=0)
    for n, g in grads[False].items():
        assert g.abs().max() > 0, n
        torch.testing.assert_close(grads[True][n], g, atol=1e-6, rtol=0, msg=n)
    assert calls[False] == calls[True] == [(i, 16) for i in range(5)]


def test_checkpointing_check_can_fail():
    """Without the replayed dropout masks the gradients differ: the comparison above can fail."""
    graph, idx = _local()
    x = torch.randn(50, 7, generator=torch.Generator().manual_seed(1))
    grads = []
    for seed in (42, 43):
        cfg = ModelConfig(layers=3, hidden=16, dropout=0.5, residual="res+", checkpoint=True)
        torch.manual_seed(0)
        model = ResPlusGNN(cfg, 7, 3).train()
        torch.manual_seed(seed)
        model(x, graph, _GatherHalo(idx)).sum().backward()
        grads.append(model.encoder.weight.grad.clone())
    assert (grads[0] - grads[1]).abs().max() > 1e-4


@pytest.mark.parametrize("name,act,p", [("gcn", "relu", 0.5), ("gcn", "maxk", 0.0), ("sage", "relu", 0.0),
                                        ("sage", "elu", 0.5), ("sage", "maxk", 0.5)])
def test_saved_bytes_per_block_is_what_a_model_keeps(name, act, p):
    """The per-block measurement equals what a whole model keeps per block (the difference
    between a 3- and a 2-block model on another graph of the same size, storages counted
    once, weights not counted); checkpointing keeps less."""
    graph, idx = _local(n_own=50, n_halo=20)
    x = torch.randn(50, 7)
    saved = {}
    for layers in (2, 3):
        cfg = ModelConfig(name=name, layers=layers, hidden=16, activation=act, maxk_k=4, dropout=p,
                          residual="res+")
        model = ResPlusGNN(cfg, 7, 3).train()
        weights = {w.untyped_storage().data_ptr() for w in model.parameters()}
        seen: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            s = t.untyped_storage()
            if s.data_ptr() not in weights:
                seen[s.data_ptr()] = s.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(x, graph, _GatherHalo(idx))
        saved[layers] = sum(seen.values())
    per_block = ResPlusGNN.saved_bytes_per_block(cfg, 50, 20)
    assert per_block == saved[3] - saved[2]
    assert per_block >= 4 * 50 * 16 * (2 if act != "maxk" else 1)  # at least LayerNorm's input (+ the act's)
    ckpt = ResPlusGNN.saved_bytes_per_block(replace(cfg, checkpoint=True), 50, 20)
    assert ckpt == 4 * 70 * 16 < per_block
    wide = ResPlusGNN.saved_bytes_per_block(cfg, 50, 20, dtype=torch.float64)
    if act != "maxk" and p == 0.0:
        assert wide == 2 * per_block
    else:  # MaxK's and dropout's bool masks keep 1 byte whatever the dtype
        assert per_block < wide < 2 * per_block


# ---- configuration, refusals, CLI

def test_res_plus_settings_are_checked():
    with pytest.raises(ConfigError, match="GCN or GraphSAGE"):
        ModelConfig(name="gat", residual="res+")
    with pytest.raises(ConfigError, match="residual = 'res\\+'"):
        ModelConfig(checkpoint=True)
    with pytest.raises(ConfigError, match="'none' or 'res\\+'"):
        ModelConfig(residual="res")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="precompute"):
        RunConfig(model=ModelConfig(residual="res+"), comm=CommConfig(halo=HaloConfig(precompute=True)))
    with pytest.raises(ConfigError, match="full-graph only"):
        RunConfig(model=ModelConfig(name="sage", residual="res+"), train=TrainConfig(mode="minibatch"),
                  minibatch=SamplerConfig(fanout=(5, 5)))
    with pytest.raises(ConfigError, match="ResPlusGNN"):
        PartitionGNN(ModelConfig(residual="res+"), 4, 2)
    # Default behaviour is unchanged: the plain stack, MaxK messages after the first layer only.
    assert maxk_message_layers(ModelConfig(layers=4, activation="maxk", maxk_k=8), 12, 3, False) == {1, 2, 3}
    assert maxk_message_layers(ModelConfig(layers=4, activation="maxk", maxk_k=8, residual="res+"),
                               12, 3, False) == {0, 1, 2, 3}


def test_the_trainer_refuses_precompute_and_minibatch_with_res_plus():
    data = _graph()
    part = build_local_partition(data, torch.zeros(data.num_nodes, dtype=torch.long), 1, 0)
    mcfg, tcfg = _cfgs("sage")
    with pytest.raises(ConfigError, match="precompute"):
        FullGraphTrainer(DistContext.single(), part, mcfg, tcfg, Hooks(),
                         comm_cfg=CommConfig(halo=HaloConfig(precompute=True)))
    from commgnn.trainers.minibatch import MiniBatchTrainer
    from commgnn.fetch.config import FetchConfig

    with pytest.raises(ConfigError, match="full-graph only"):
        MiniBatchTrainer(DistContext.single(), part, mcfg, tcfg, Hooks(), sampler_cfg=SamplerConfig(),
                         fetch_cfg=FetchConfig())


@pytest.mark.parametrize("name", ["gcn", "sage"])
def test_reference_and_partition_model_share_parameter_names_and_order(name):
    cfg = ModelConfig(name=name, residual="res+", layers=3, hidden=8)
    ref = [(k, p.shape) for k, p in ReferenceGNN(cfg, 5, 3).named_parameters()]
    ours = [(k, p.shape) for k, p in ResPlusGNN(cfg, 5, 3).named_parameters()]
    assert ref == ours and len(ours) == 2 + 3 * (2 if name == "gcn" else 3) + 3 * 2 + 2 + 2


def test_flags_and_toml_keys(tmp_path: Path):
    ns = build_parser().parse_args(["train", "--residual", "res+", "--checkpoint-activations", "--layers", "28"])
    flags = {k: v for k, v in vars(ns).items() if v is not None and k not in ("command", "config")}
    cfg = resolve_config(None, flags, {})
    assert (cfg.model.residual, cfg.model.checkpoint, cfg.model.layers) == ("res+", True, 28)
    toml = tmp_path / "run.toml"
    toml.write_text('[model]\nname = "sage"\nresidual = "res+"\ncheckpoint = true\nlayers = 7\n')
    cfg = resolve_config(str(toml), {}, {})
    assert (cfg.model.name, cfg.model.residual, cfg.model.checkpoint, cfg.model.layers) == ("sage", "res+", True, 7)
    assert resolve_config(None, {}, {}).model.residual == "none"


def test_a_res_plus_run_end_to_end(tmp_path: Path):
    """``commgnn.train`` on 2 ranks: the exported PyG reference reproduces the distributed
    predictions, and every block exchanges hidden-wide rows forward and back."""
    import commgnn

    data = _graph()
    layers = 4
    result = commgnn.train(data, model="sage", parts=2, residual="res+", layers=layers, hidden=8, epochs=2,
                           checkpoint_activations=True, quiet=True, threads=1, out=tmp_path / "run")
    assert isinstance(result.model, ReferenceGNN) and result.model.cfg.residual == "res+"
    torch.testing.assert_close(result.model(data.x, data.edge_index), result.predictions, atol=1e-4, rtol=0)
    by_layer = result.summary["bytes_by_layer"]
    fwd = [by_layer["halo_fwd"][str(i)] for i in range(layers)]
    bwd = [by_layer["halo_bwd"][str(i)] for i in range(layers)]
    assert fwd[0] > 0 and len(set(fwd)) == 1 and bwd == fwd  # fp32 rows of width 8, both directions
    assert by_layer["halo_fwd"]["other"] == 0
