"""GPU checks (issue #15, section 5): the halo levers and gradient strategies on NCCL, marked ``gpu``.

Every test here skips where ``torch.cuda.is_available()`` is false (CI, CPU machines), and
the multi-rank ones also where fewer than two GPUs are visible: NCCL refuses two ranks on
one GPU. Run them with ``pytest -m gpu tests/test_gpu.py tests/test_gpu_levers.py -rs``
(``tests/test_gpu.py``: the kernels, exactness and the CLI path on CUDA).

What is checked: every halo lever moves device rows through NCCL within its documented
error of the exact exchange (forward rows and backward gradients); every lever and every
gradient strategy (torch's bf16 hook included) trains GCN and GAT on NCCL with a finite,
falling loss within its tolerance of the exact run (GAT aggregates without the CSR kernel,
so a kernel failure cannot hide what NCCL does); and training resumes on the device from a
checkpoint loaded as ``commgnn.trainers.checkpoint`` loads it (``map_location="cpu"``),
equal to the uninterrupted run, for the levers and strategies that keep state.

Ranks run as :mod:`gpu_helpers` describes: the ``self`` cases start one rank on a real NCCL
communicator of world size 1 (:class:`gpu_helpers.SelfContext`), so every collective the
code issues really runs; traffic between GPUs needs the two-GPU cases. The ``shared`` cases
run two gloo ranks on the one GPU (``runtime.backend = "gloo"``), so that rows, gradients,
MaxK's (index, value) messages, compressed gradients and gossip really travel between
ranks as device tensors with one GPU (bf16 skips: torch's hook for it needs NCCL). The rank functions
are device-agnostic: on a CPU machine the same cases run on gloo (and the same checks hold),
which is how their tolerances were set without a GPU.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch_geometric.data import Data

from commgnn.comm.build import build_halo
from commgnn.comm.config import CommConfig, GossipConfig, GradConfig, HaloConfig
from commgnn.comm.halo.alltoall import AllToAllHalo
from commgnn.comm.halo.protocol import HaloPlan
from commgnn.data import SyntheticConfig, make_csbm
from commgnn.distributed.context import DistContext
from commgnn.distributed.events import Hooks
from commgnn.models import ModelConfig
from commgnn.models.maxk import maxk
from commgnn.partition import PartitionConfig, assign_parts, build_local_partition
from commgnn.trainers import FullGraphTrainer, TrainConfig, halo_plan
from commgnn.integrity import load_verified, save_tensors
from commgnn.trainers.checkpoint import from_plain, to_plain
from gpu_helpers import GPU_MARKS, SHARED_GPU, error_text, run_ranks, two_gpus
from helpers import small_graph

pytestmark = GPU_MARKS


def csbm(n: int = 300, seed: int = 4) -> Data:
    """The small homophilous graph the CPU gradient-strategy tests train on."""
    data = make_csbm(SyntheticConfig(num_nodes=n, num_classes=3, feature_dim=8, avg_degree=6.0,
                                     homophily=0.9, seed=seed))
    data.num_classes_total = 3
    return data


# ---------------------------------------------------------------- (b) halo levers on NCCL: the exchange
EX_EPOCHS = 6
EX_D = 6
EX_K = 3  # MaxK: entries kept per row (< EX_D, so the sparse messages engage)

EXCHANGE_LEVERS: dict[str, tuple[HaloConfig, bool]] = {
    # name: (config, rows from a MaxK activation)
    "exact": (HaloConfig(), False),
    "q8": (HaloConfig(bits=8), False),
    "q4f-8b": (HaloConfig(bits={"forward": 4, "backward": 8}), False),
    "q1": (HaloConfig(bits=1), False),
    "adaptive": (HaloConfig(bits="adaptive", budget_mb=0.001, adapt_every=2), False),
    "sample0.5": (HaloConfig(sample_rate=0.5), False),
    "pipeline": (HaloConfig(staleness={"mode": "pipeline"}), False),
    "skip": (HaloConfig(staleness={"mode": "skip", "threshold": 10.0, "max_age": 2}), False),
    "skip-residual8": (HaloConfig(staleness={"mode": "skip", "threshold": 10.0, "max_age": 2, "residual_bits": 8}),
                       False),
    "guard-q2": (HaloConfig(bits=2, exact_every=3), False),
    "maxk": (HaloConfig(), True),
    "maxk-q8": (HaloConfig(bits=8), True),
    "maxk-adaptive": (HaloConfig(bits="adaptive", budget_mb=0.001, adapt_every=2), True),
}


def _ex_rows(rank: int, epoch: int, n: int, sparse: bool, device: torch.device) -> torch.Tensor:
    """Rows that drift by about 1 per epoch (so ``skip`` with threshold 10 resends by age)."""
    g = torch.Generator().manual_seed(1000 * epoch + rank)
    h = torch.randn(n, EX_D, generator=g) + epoch
    return (maxk(h, EX_K) if sparse else h).to(device)


def lever_exchange_fn(ctx: DistContext, data: Data | None, parts: torch.Tensor | None, names: list[str]) -> dict:
    """Each lever's forward rows and backward gradients over EX_EPOCHS epochs, next to the
    exact exchange's. ``data is None``: one rank sending 64 rows to itself (loopback)."""
    if data is None:
        n = 64
        plan = HaloPlan(send_index=torch.arange(n, device=ctx.device), send_counts=[n], recv_counts=[n])
    else:
        part = build_local_partition(data, parts, ctx.world_size, ctx.rank).to(ctx.device)
        plan, n = halo_plan(part), part.num_owned
    out: dict[str, Any] = {}
    for name in names:
        cfg, sparse = EXCHANGE_LEVERS[name]
        try:
            lever = build_halo(ctx, plan, Hooks(), cfg, num_layers=1, seed=7,
                               maxk=(EX_K, {0}) if sparse else None)
            exact = AllToAllHalo(ctx, plan, Hooks())
            rec: dict[str, list] = {"rows": [], "outs": [], "truths": [], "grads": [], "true_grads": []}
            for epoch in range(EX_EPOCHS):
                lever.set_epoch(epoch, exact=bool(cfg.exact_every) and epoch % cfg.exact_every == 0)
                h = _ex_rows(ctx.rank, epoch, n, sparse, ctx.device).requires_grad_()
                got = lever.exchange(h, 0)
                weight = torch.arange(1, got.numel() + 1, dtype=got.dtype, device=got.device).view_as(got) / 100
                (got * weight).sum().backward()
                lever.flush()
                h2 = h.detach().clone().requires_grad_()
                truth = exact.exchange(h2, 0)
                (truth * weight).sum().backward()
                assert got.device == h.device and h.grad is not None and h.grad.device == h.device
                for key, t in (("rows", h), ("outs", got), ("truths", truth), ("grads", h.grad),
                               ("true_grads", h2.grad)):
                    rec[key].append(t.detach().clone())
            rec["max_age"] = getattr(lever, "max_age_used", None)
            rec["device"] = str(got.device)
            out[name] = rec
        except Exception as exc:  # recorded, so that one failing lever does not hide the others
            out[name] = {"error": error_text(exc)}
    return out


def _within_step(got: torch.Tensor, truth: torch.Tensor, bits: int, what: str) -> None:
    """Stochastic rounding of a row to ``bits`` bits moves each entry by less than one step."""
    step = (truth.max(1).values - truth.min(1).values) / (2 ** bits - 1) if truth.numel() else truth.new_zeros(0)
    err = (got - truth).abs()
    bound = step[:, None] * (1 + 1e-5) + 1e-5
    assert (err <= bound).all(), f"{what}: error {float((err - bound).max()):.3g} past one {bits}-bit step"


def check_exchange(name: str, r: dict) -> None:
    assert "error" not in r, f"{name}: {r.get('error')}"
    cfg, sparse = EXCHANGE_LEVERS[name]
    outs, truths, grads, tgrads, rows = r["outs"], r["truths"], r["grads"], r["true_grads"], r["rows"]
    for e in range(EX_EPOCHS):
        assert torch.isfinite(outs[e]).all() and torch.isfinite(grads[e]).all(), (name, e)
        if truths[e].numel() == 0:
            assert outs[e].shape == truths[e].shape
    if name in ("exact", "maxk"):
        for e in range(EX_EPOCHS):
            assert torch.equal(outs[e], truths[e]), (name, e)
            mask = (rows[e] != 0) if sparse else torch.ones_like(rows[e], dtype=torch.bool)
            # MaxK sends gradients back only where the row was non-zero (zero elsewhere)
            torch.testing.assert_close(grads[e], tgrads[e] * mask, atol=1e-6, rtol=1e-6, msg=f"{name} grad {e}")
    elif name in ("q8", "q4f-8b", "q1", "maxk-q8"):
        fb = {"q8": 8, "q4f-8b": 4, "q1": 1, "maxk-q8": 8}[name]
        bb = {"q8": 8, "q4f-8b": 8, "q1": 1, "maxk-q8": 8}[name]
        for e in range(EX_EPOCHS):
            _within_step(outs[e], truths[e], fb, f"{name} forward, epoch {e}")
            mask = (rows[e] != 0) if sparse else torch.ones_like(rows[e], dtype=torch.bool)
            _within_step(grads[e], tgrads[e] * mask, bb, f"{name} backward, epoch {e}")
            if sparse:
                assert torch.equal(outs[e] != 0, truths[e] != 0) or not truths[e].numel(), (name, e)
    elif name in ("adaptive", "maxk-adaptive"):  # 8 bits until the first solve, then 1..8 bits per block
        for e in range(EX_EPOCHS):
            mask = (rows[e] != 0) if sparse else torch.ones_like(rows[e], dtype=torch.bool)
            _within_step(outs[e], truths[e], 8 if e < cfg.adapt_every else 1, f"{name} forward, epoch {e}")
            _within_step(grads[e], tgrads[e] * mask, 8 if e < cfg.adapt_every else 1, f"{name} backward, epoch {e}")
            if sparse:  # values only where the sender's top-k was; the indices travel exact
                assert ((outs[e] != 0) <= (truths[e] != 0)).all(), (name, e)
                assert ((grads[e] != 0) <= mask).all(), (name, e)
    elif name == "sample0.5":  # a row arrives scaled by 1/p, or as zeros; its gradient likewise
        kept_total = rows_total = 0
        for e in range(EX_EPOCHS):
            kept = outs[e].abs().sum(1) > 0
            torch.testing.assert_close(outs[e][kept], truths[e][kept] / 0.5, msg=f"{name} epoch {e}")
            assert (outs[e][~kept] == 0).all()
            back = grads[e].abs().sum(1) > 0
            torch.testing.assert_close(grads[e][back], tgrads[e][back] / 0.5, msg=f"{name} grad {e}")
            kept_total, rows_total = kept_total + int(kept.sum()), rows_total + kept.numel()
        if rows_total >= 100:
            assert 0.25 < kept_total / rows_total < 0.75, (name, kept_total, rows_total)
    elif name == "pipeline":  # epoch t computes with epoch t-1's rows and gradients
        assert torch.equal(outs[0], truths[0]) and torch.equal(grads[0], tgrads[0])
        for e in range(1, EX_EPOCHS):
            assert torch.equal(outs[e], truths[e - 1]), (name, e)
            assert torch.equal(grads[e], tgrads[e - 1]), (name, e)
    elif name in ("skip", "skip-residual8"):  # rows drift ~1 per epoch: only the age bound resends
        assert r["max_age"] is not None and r["max_age"] <= 2, r["max_age"]
        assert torch.equal(outs[0], truths[0])  # epoch 0 sends every row; 1, 2 none (ages 1, 2);
        for e in (1, 2, 4, 5):                  # 3 every row again (age 3 > max_age); 4, 5 none
            assert torch.equal(outs[e], outs[3 * (e // 3)]), (name, e)
        if name == "skip":
            assert torch.equal(outs[3], truths[3])
        else:  # resent as the 8-bit residual against what the receiver held
            _within_step(outs[3] - truths[0], truths[3] - truths[0], 8, f"{name} residual, epoch 3")
        for e in range(EX_EPOCHS):
            torch.testing.assert_close(grads[e], tgrads[e], msg=f"{name} gradients pass through, epoch {e}")
    elif name == "guard-q2":
        for e in range(EX_EPOCHS):
            if e % 3 == 0:
                assert torch.equal(outs[e], truths[e]) and torch.equal(grads[e], tgrads[e]), (name, e)
            else:
                _within_step(outs[e], truths[e], 2, f"{name} forward, epoch {e}")
    else:  # pragma: no cover - a lever without a check
        raise AssertionError(f"no check for {name}")


@pytest.fixture(scope="module")
def exchange_self(tmp_path_factory):
    return run_ranks(lever_exchange_fn, 1, tmp_path_factory.mktemp("exchange-self"), None, None,
                     list(EXCHANGE_LEVERS))[0]


@pytest.fixture(scope="module")
def exchange_two(tmp_path_factory):
    data = small_graph(n=80, m=400)
    parts = assign_parts(data.edge_index, data.num_nodes, 2, PartitionConfig(method="random", seed=2))
    return run_ranks(lever_exchange_fn, 2, tmp_path_factory.mktemp("exchange-two"), data, parts,
                     list(EXCHANGE_LEVERS))


@pytest.fixture(scope="module")
def exchange_shared(tmp_path_factory):
    data = small_graph(n=80, m=400)
    parts = assign_parts(data.edge_index, data.num_nodes, 2, PartitionConfig(method="random", seed=2))
    return run_ranks(lever_exchange_fn, 2, tmp_path_factory.mktemp("exchange-shared"), data, parts,
                     list(EXCHANGE_LEVERS), **SHARED_GPU)


@pytest.mark.parametrize("name", list(EXCHANGE_LEVERS))
def test_halo_lever_exchanges_device_rows_through_nccl_on_one_gpu(exchange_self, name):
    assert exchange_self[name].get("device", "").startswith("cuda"), exchange_self[name]
    check_exchange(name, exchange_self[name])


@two_gpus
@pytest.mark.parametrize("name", list(EXCHANGE_LEVERS))
def test_halo_lever_exchanges_device_rows_between_two_gpus(exchange_two, name):
    for r in exchange_two:
        assert r[name].get("device", "").startswith("cuda"), r[name]
        check_exchange(name, r[name])


@pytest.mark.parametrize("name", list(EXCHANGE_LEVERS))
def test_halo_lever_exchanges_device_rows_between_two_gloo_ranks_sharing_one_gpu(exchange_shared, name):
    for r in exchange_shared:
        assert r[name].get("device", "").startswith("cuda"), r[name]
        check_exchange(name, r[name])


# ---------------------------------------------------------------- (b) levers and strategies train on NCCL
EPOCHS = 25
_TRAIN = TrainConfig(epochs=EPOCHS, lr=0.02, patience=0)
TRAIN_MODELS = {
    # GAT aggregates with index_add_ and PyG's softmax, GCN with the CSR kernel: a lever or a
    # strategy is checked on both, so a kernel failure does not hide what NCCL does.
    "gcn": ModelConfig(name="gcn", hidden=16, dropout=0.0),
    "gat": ModelConfig(name="gat", hidden=16, heads=4, dropout=0.0),
}
_MAXK = ModelConfig(name="gcn", hidden=16, layers=3, dropout=0.0, activation="maxk", maxk_k=4)

TRAIN_LEVERS: dict[str, tuple[HaloConfig, str, float, bool]] = {
    # name: (levers, the run it is compared with, tolerance on the final loss on two ranks,
    #        MaxK model: GCN with the MaxK activation instead of the parametrised model)
    "exact": (HaloConfig(), "exact", 0.0, False),
    "transform_first": (HaloConfig(transform_first=True), "exact", 1e-4, False),
    "precompute": (HaloConfig(precompute=True), "exact", 1e-4, False),
    "lossless": (HaloConfig(precompute=True, transform_first=True), "exact", 1e-4, False),
    "q8": (HaloConfig(bits=8), "exact", 0.05, False),
    "q4f-8b": (HaloConfig(bits={"forward": 4, "backward": 8}), "exact", 0.1, False),
    "tf+q4": (HaloConfig(transform_first=True, bits={"forward": 4, "backward": 8}), "exact", 0.1, False),
    "adaptive": (HaloConfig(bits="adaptive", budget_mb=0.01, adapt_every=3), "exact", 0.15, False),
    "adaptive-time": (HaloConfig(bits="adaptive", budget_s=0.05, adapt_every=3), "exact", 0.15, False),
    "lossless+adaptive": (HaloConfig(precompute=True, transform_first=True, bits="adaptive", budget_mb=0.01,
                                     adapt_every=3), "exact", 0.15, False),
    "sample0.5": (HaloConfig(sample_rate=0.5), "exact", 0.15, False),
    "pipeline": (HaloConfig(staleness={"mode": "pipeline"}), "exact", 0.15, False),
    "pipeline-ema-ctl": (HaloConfig(staleness={"mode": "pipeline", "smoothing": 0.5, "max_error": 0.2}),
                         "exact", 0.15, False),
    "skip": (HaloConfig(staleness={"mode": "skip", "threshold": 0.05, "max_age": 3}), "exact", 0.1, False),
    "skip-residual8": (HaloConfig(staleness={"mode": "skip", "threshold": 0.05, "max_age": 3, "residual_bits": 8}),
                       "exact", 0.1, False),
    "guard-q2": (HaloConfig(bits=2, exact_every=3), "exact", 0.15, False),
    "maxk-exact": (HaloConfig(), "maxk-exact", 0.0, True),
    "maxk-q8": (HaloConfig(bits=8), "maxk-exact", 0.05, True),
    "maxk-adaptive": (HaloConfig(bits="adaptive", budget_mb=0.01, adapt_every=3), "maxk-exact", 0.15, True),
}
LEVER_IDS = [(m, n) for m in TRAIN_MODELS for n, spec in TRAIN_LEVERS.items() if m == "gcn" or not spec[3]]

STRATEGIES: dict[str, tuple[CommConfig, bool]] = {
    # name: (config, near-exact: tracks the fp32 all-reduce within STRATEGY_TOL); all train with
    # Adam except those of STRATEGY_TRAIN
    "allreduce": (CommConfig(), True),
    "fp16": (CommConfig(grad=GradConfig(strategy="fp16")), True),
    "fp16-noprescale": (CommConfig(grad=GradConfig(strategy="fp16", prescale=False)), True),
    "bf16": (CommConfig(grad=GradConfig(strategy="bf16")), True),
    "powersgd": (CommConfig(grad=GradConfig(strategy="powersgd", rank=2, start_iter=2)), True),
    "powersgd-half": (CommConfig(grad=GradConfig(strategy="powersgd", rank=2, start_iter=2, half=True)), True),
    "localsgd": (CommConfig(grad=GradConfig(strategy="localsgd", start_iter=2, period=2)), True),
    "topk": (CommConfig(grad=GradConfig(strategy="topk", ratio=0.05, warmup_steps=5)), False),
    "topk-dgc": (CommConfig(grad=GradConfig(strategy="topk", ratio=0.05, warmup_steps=3, momentum=0.9,
                                            clip_norm=5.0)), False),
    "cltk": (CommConfig(grad=GradConfig(strategy="cltk", ratio=0.2, half=True)), False),
    "cltk-mc": (CommConfig(grad=GradConfig(strategy="cltk", ratio=0.1, half=True, momentum=0.9)), False),
    "qsgd": (CommConfig(grad=GradConfig(strategy="qsgd", levels=7)), False),
    "qsgd-ef": (CommConfig(grad=GradConfig(strategy="qsgd", levels=15, error_feedback=True)), False),
    "signsgd": (CommConfig(grad=GradConfig(strategy="signsgd")), False),
    "dpsgd-exponential": (CommConfig(gossip=GossipConfig(topology="exponential")), False),
    "dpsgd-atc": (CommConfig(gossip=GossipConfig(topology="exponential", method="dpsgd-atc")), False),
    "pushsum-ring": (CommConfig(gossip=GossipConfig(topology="ring", method="pushsum")), False),
    "tracking": (CommConfig(gossip=GossipConfig(topology="exponential", method="tracking")), True),
    "tracking-atc": (CommConfig(gossip=GossipConfig(topology="exponential", method="tracking-atc")), True),
    "dpsgd-pga": (CommConfig(gossip=GossipConfig(topology="ring", average_every=3)), False),
    "dpsgd-qgm": (CommConfig(gossip=GossipConfig(topology="exponential", momentum=0.9)), False),
}
STRATEGY_TRAIN = {  # QG-DSGDm replaces the optimiser's momentum: it is meant for SGD (with Adam it stalls)
    "dpsgd-qgm": TrainConfig(epochs=EPOCHS, lr=0.1, optimizer="sgd", patience=0),
}
STRATEGY_IDS = [(m, n) for m in TRAIN_MODELS for n in STRATEGIES]
STRATEGY_TOL = 0.15
DDP_STRATEGIES = ("fp16", "fp16-noprescale", "bf16", "powersgd", "powersgd-half", "localsgd")
NCCL_ONLY = "bf16"  # torch has no gloo hook for it
MAXK_ALONE = ("one rank has no halo to exchange, so MaxK's (index, value) messages are not built at world size 1; "
              "they are checked on NCCL by the two-GPU test and the loopback exchange test")


def train_cases_fn(ctx: DistContext, data: Data, parts: torch.Tensor,
                   cases: dict[str, tuple[ModelConfig, TrainConfig, CommConfig]]) -> dict:
    """Each case's loss per epoch (global), or the error it raised."""
    part = build_local_partition(data, parts, ctx.world_size, ctx.rank)
    out: dict[str, Any] = {}
    for key, (mcfg, tcfg, comm) in cases.items():
        try:
            trainer = FullGraphTrainer(ctx, part, mcfg, tcfg, Hooks(), comm_cfg=comm)
            losses = [r.loss for r in trainer.run()]
            out[key] = {"losses": losses, "device": str(trainer.x.device), "net": type(trainer.net).__name__,
                        "params": sorted({str(p.device) for p in trainer.model.parameters()})}
        except Exception as exc:  # recorded, so that one failing case does not hide the others
            out[key] = {"error": error_text(exc)}
    return out


def lever_cases(world_size: int = 2) -> dict[str, tuple[ModelConfig, TrainConfig, CommConfig]]:
    """The training cases ``lever@model`` of LEVER_IDS (at world size 1 without MaxK: see MAXK_ALONE)."""
    cases = {}
    for model, name in LEVER_IDS:
        halo, _, _, is_maxk = TRAIN_LEVERS[name]
        if world_size > 1 or not is_maxk:
            cases[f"{name}@{model}"] = (_MAXK if is_maxk else TRAIN_MODELS[model], _TRAIN, CommConfig(halo=halo))
    return cases


def strategy_cases() -> dict[str, tuple[ModelConfig, TrainConfig, CommConfig]]:
    return {f"{name}@{model}": (TRAIN_MODELS[model], STRATEGY_TRAIN.get(name, _TRAIN), STRATEGIES[name][0])
            for model, name in STRATEGY_IDS}


def _ran_on(res: dict, key: str, device: str) -> list[float]:
    r = res[key]
    assert "error" not in r, f"{key}: {r.get('error')}"
    assert r["device"].startswith(device) and all(d.startswith(device) for d in r["params"]), (key, r)
    losses = r["losses"]
    assert len(losses) == EPOCHS and all(math.isfinite(v) for v in losses), (key, losses)
    return losses


def check_lever_training(res: dict, model: str, name: str, world_size: int, device: str = "cuda") -> None:
    _, base, tol, _ = TRAIN_LEVERS[name]
    losses, exact = _ran_on(res, f"{name}@{model}", device), _ran_on(res, f"{base}@{model}", device)
    assert losses[-1] < 0.7 * losses[0], (name, model, losses[0], losses[-1])
    if world_size == 1 or tol <= 1e-4:  # no halo at world size 1: every lever is exact there
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(exact), atol=1e-4, rtol=1e-4,
                                   msg=f"{name}@{model} against {base}")
    else:
        assert abs(losses[-1] - exact[-1]) <= tol, (name, model, losses[-1], base, exact[-1], tol)


def check_strategy_training(res: dict, model: str, name: str, device: str = "cuda") -> None:
    _, near_exact = STRATEGIES[name]
    losses, exact = _ran_on(res, f"{name}@{model}", device), _ran_on(res, f"allreduce@{model}", device)
    assert losses[-1] < 0.6 * losses[0], (name, model, losses[0], losses[-1])
    if near_exact:
        assert abs(losses[-1] - exact[-1]) <= STRATEGY_TOL, (name, model, losses[-1], exact[-1])
    if name in DDP_STRATEGIES:  # torch's comm hook really ran: the model is wrapped in DDP
        assert res[f"{name}@{model}"]["net"] == "DistributedDataParallel", (name, res[f"{name}@{model}"]["net"])


@pytest.fixture(scope="module")
def csbm_graph():
    data = csbm()
    return data, {1: torch.zeros(data.num_nodes, dtype=torch.long),
                  2: assign_parts(data.edge_index, data.num_nodes, 2, PartitionConfig(method="metis"))}


@pytest.fixture(scope="module")
def levers_self(tmp_path_factory, csbm_graph):
    data, parts = csbm_graph
    return run_ranks(train_cases_fn, 1, tmp_path_factory.mktemp("levers-self"), data, parts[1], lever_cases(1))[0]


@pytest.fixture(scope="module")
def levers_two(tmp_path_factory, csbm_graph):
    data, parts = csbm_graph
    return run_ranks(train_cases_fn, 2, tmp_path_factory.mktemp("levers-two"), data, parts[2], lever_cases(2))


@pytest.fixture(scope="module")
def strategies_self(tmp_path_factory, csbm_graph):
    data, parts = csbm_graph
    return run_ranks(train_cases_fn, 1, tmp_path_factory.mktemp("grad-self"), data, parts[1], strategy_cases())[0]


@pytest.fixture(scope="module")
def strategies_two(tmp_path_factory, csbm_graph):
    data, parts = csbm_graph
    return run_ranks(train_cases_fn, 2, tmp_path_factory.mktemp("grad-two"), data, parts[2], strategy_cases())


@pytest.fixture(scope="module")
def levers_shared(tmp_path_factory, csbm_graph):
    data, parts = csbm_graph
    return run_ranks(train_cases_fn, 2, tmp_path_factory.mktemp("levers-shared"), data, parts[2], lever_cases(2),
                     **SHARED_GPU)


@pytest.fixture(scope="module")
def strategies_shared(tmp_path_factory, csbm_graph):
    data, parts = csbm_graph
    cases = {k: v for k, v in strategy_cases().items() if not k.startswith(NCCL_ONLY + "@")}
    return run_ranks(train_cases_fn, 2, tmp_path_factory.mktemp("grad-shared"), data, parts[2], cases, **SHARED_GPU)


def _ids(pairs: list[tuple[str, str]]) -> list[str]:
    return [f"{model}-{name}" for model, name in pairs]


@pytest.mark.parametrize("model,name", LEVER_IDS, ids=_ids(LEVER_IDS))
def test_halo_lever_trains_on_nccl_on_one_gpu(levers_self, model, name):
    if TRAIN_LEVERS[name][3]:
        pytest.skip(MAXK_ALONE)
    check_lever_training(levers_self, model, name, world_size=1)


@two_gpus
@pytest.mark.parametrize("model,name", LEVER_IDS, ids=_ids(LEVER_IDS))
def test_halo_lever_trains_on_two_nccl_ranks(levers_two, model, name):
    for r in levers_two:
        check_lever_training(r, model, name, world_size=2)


@pytest.mark.parametrize("model,name", LEVER_IDS, ids=_ids(LEVER_IDS))
def test_halo_lever_trains_on_two_gloo_ranks_sharing_one_gpu(levers_shared, model, name):
    for r in levers_shared:
        check_lever_training(r, model, name, world_size=2)


@pytest.mark.parametrize("model,name", STRATEGY_IDS, ids=_ids(STRATEGY_IDS))
def test_gradient_strategy_trains_on_nccl_on_one_gpu(strategies_self, model, name):
    check_strategy_training(strategies_self, model, name)


@two_gpus
@pytest.mark.parametrize("model,name", STRATEGY_IDS, ids=_ids(STRATEGY_IDS))
def test_gradient_strategy_trains_on_two_nccl_ranks(strategies_two, model, name):
    for r in strategies_two:
        check_strategy_training(r, model, name)


@pytest.mark.parametrize("model,name", STRATEGY_IDS, ids=_ids(STRATEGY_IDS))
def test_gradient_strategy_trains_on_two_gloo_ranks_sharing_one_gpu(strategies_shared, model, name):
    if name == NCCL_ONLY:
        pytest.skip("torch's bf16 comm hook needs NCCL (commgnn refuses it on gloo)")
    for r in strategies_shared:
        check_strategy_training(r, model, name)


# ---------------------------------------------------------------- (b) a checkpoint resumes on the device
RESUME_EPOCHS, RESUME_AT = 8, 4
RESUME_CASES: dict[str, CommConfig] = {
    # stateful levers and strategies whose state holds device tensors (and two that keep theirs on the CPU)
    "exact": CommConfig(),
    "skip": CommConfig(halo=HaloConfig(staleness={"mode": "skip", "threshold": 0.05, "max_age": 3})),
    "skip-residual8": CommConfig(halo=HaloConfig(staleness={"mode": "skip", "threshold": 0.05, "max_age": 3,
                                                            "residual_bits": 8})),
    "pipeline": CommConfig(halo=HaloConfig(staleness={"mode": "pipeline", "smoothing": 0.5})),
    "q8": CommConfig(halo=HaloConfig(bits=8)),
    "powersgd": CommConfig(grad=GradConfig(strategy="powersgd", rank=2, start_iter=2)),
    "topk": CommConfig(grad=GradConfig(strategy="topk", ratio=0.05)),
    # host-side state (the compressors and the bit solver keep theirs on the CPU): the resume
    # must put it back there, not where the trainer moves device state (seen failing on an H200)
    "topk-dgc": CommConfig(grad=GradConfig(strategy="topk", ratio=0.05, momentum=0.9)),
    "cltk": CommConfig(grad=GradConfig(strategy="cltk", ratio=0.05, momentum=0.9)),
    "adaptive": CommConfig(halo=HaloConfig(bits="adaptive", budget_mb=0.001, adapt_every=2)),
    "tracking": CommConfig(gossip=GossipConfig(topology="exponential", method="tracking")),
    "dpsgd-qgm": CommConfig(gossip=GossipConfig(topology="exponential", momentum=0.9)),
}


def resume_fn(ctx: DistContext, data: Data, parts: torch.Tensor, out_dir: str) -> dict:
    """Each case's losses uninterrupted, and resumed at RESUME_AT from a state saved and
    loaded as :mod:`commgnn.trainers.checkpoint` does (plain data, ``weights_only=True``, onto the CPU)."""
    part = build_local_partition(data, parts, ctx.world_size, ctx.rank)
    model = TRAIN_MODELS["gat"]  # independent of the CSR kernel
    out: dict[str, Any] = {}
    for name, comm in RESUME_CASES.items():
        tcfg = replace(STRATEGY_TRAIN.get(name, _TRAIN), epochs=RESUME_EPOCHS)
        try:
            def make() -> FullGraphTrainer:
                return FullGraphTrainer(ctx, part, model, tcfg, Hooks(), comm_cfg=comm)

            whole = make()
            ref = [whole.step().loss for _ in range(RESUME_EPOCHS)]
            first = make()
            head = [first.step().loss for _ in range(RESUME_AT)]
            path = Path(out_dir) / f"{name}-rank{ctx.rank}.pt"
            sha = save_tensors(to_plain(first.state_dict()), path)  # as checkpoint.save_rank writes it
            second = make()
            second.load_state_dict(from_plain(load_verified(path, sha)))  # weights_only=True, as load_rank
            tail = [second.step().loss for _ in range(RESUME_EPOCHS - RESUME_AT)]
            out[name] = {"ref": ref, "resumed": head + tail, "device": str(second.x.device)}
        except Exception as exc:
            out[name] = {"error": error_text(exc)}
    return out


def check_resume(res: dict, name: str, device: str = "cuda") -> None:
    r = res[name]
    assert "error" not in r, f"{name}: {r.get('error')}"
    assert r["device"].startswith(device), r
    resumed, ref = torch.tensor(r["resumed"]), torch.tensor(r["ref"])
    assert torch.isfinite(resumed).all(), (name, r["resumed"])
    # PowerSGD included: its state follows DDP's bucket order (commgnn/comm/grad/powersgd_layout.py)
    torch.testing.assert_close(resumed, ref, atol=1e-4, rtol=1e-4,
                               msg=f"{name}: resumed at epoch {RESUME_AT} vs uninterrupted")


@pytest.fixture(scope="module")
def resume_self(tmp_path_factory, csbm_graph):
    data, parts = csbm_graph
    tmp = tmp_path_factory.mktemp("resume-self")
    return run_ranks(resume_fn, 1, tmp, data, parts[1], str(tmp))[0]


@pytest.fixture(scope="module")
def resume_two(tmp_path_factory, csbm_graph):
    data, parts = csbm_graph
    tmp = tmp_path_factory.mktemp("resume-two")
    return run_ranks(resume_fn, 2, tmp, data, parts[2], str(tmp))


@pytest.fixture(scope="module")
def resume_shared(tmp_path_factory, csbm_graph):
    data, parts = csbm_graph
    tmp = tmp_path_factory.mktemp("resume-shared")
    return run_ranks(resume_fn, 2, tmp, data, parts[2], str(tmp), **SHARED_GPU)


@pytest.mark.parametrize("name", list(RESUME_CASES))
def test_checkpoint_resumes_on_nccl_on_one_gpu(resume_self, name):
    check_resume(resume_self, name)


@two_gpus
@pytest.mark.parametrize("name", list(RESUME_CASES))
def test_checkpoint_resumes_on_two_nccl_ranks(resume_two, name):
    for r in resume_two:
        check_resume(r, name)


@pytest.mark.parametrize("name", list(RESUME_CASES))
def test_checkpoint_resumes_on_two_gloo_ranks_sharing_one_gpu(resume_shared, name):
    for r in resume_shared:
        check_resume(r, name)
