"""MaxK: the activation, its sparse halo messages, their bytes, and training with them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from commgnn.comm.halo.alltoall import AllToAllHalo
from commgnn.comm.halo.maxk_rows import MaxKRows
from commgnn.comm.halo.protocol import HaloPlan
from commgnn.comm.halo.sampled import Sampled
from commgnn.errors import ConfigError
from commgnn.models.config import ModelConfig
from commgnn.models.maxk import maxk
from helpers import bytes_by_class


def test_maxk_keeps_the_k_largest_and_passes_gradients_only_there():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(50, 20, generator=g, requires_grad=True)
    out = maxk(h, 4)
    ref_idx = h.detach().topk(4, dim=1).indices
    mask = torch.zeros(50, 20, dtype=torch.bool).scatter_(1, ref_idx, True)
    assert torch.equal(out, torch.where(mask, h, torch.zeros_like(h)))
    assert ((out != 0).sum(1) <= 4).all()
    w = torch.randn(50, 20, generator=g)
    (out * w).sum().backward()
    assert torch.equal(h.grad, torch.where(mask, w, torch.zeros_like(w)))  # straight-through on kept entries
    assert maxk(h, 20) is h


def test_maxk_settings_are_checked():
    with pytest.raises(ConfigError, match="maxk_k"):
        ModelConfig(activation="maxk", hidden=16, maxk_k=32)
    with pytest.raises(ConfigError, match="activation"):
        ModelConfig(activation="gelu")
    with pytest.raises(ConfigError, match="at most 65536"):
        ModelConfig(activation="maxk", hidden=65537, maxk_k=8)
    assert ModelConfig(name="gat").act == "elu" and ModelConfig(activation="maxk").act == "maxk"
    from commgnn.runner.config import RunConfig
    from commgnn.config import from_dict

    with pytest.raises(ConfigError, match="staleness"):
        from_dict(RunConfig, {"model": {"activation": "maxk"}, "comm": {"halo": {"staleness": {"mode": "pipeline"}}}})
    # adaptive widths compose: the solver sizes the values (tests below)
    from_dict(RunConfig, {"model": {"activation": "maxk"}, "comm": {"halo": {"bits": "adaptive", "budget_mb": 1.0}}})


def exchange_rank(ctx, k: int, bits: int, rate: float = 1.0, base: int = 7, guard: bool = False):
    """Dense and sparse exchange of the same MaxK rows on every rank: values and gradients.
    Rank r sends ``base + q`` rows to peer q (``base = 0``: rank 0 receives none);
    ``guard``: in a guard epoch (exact)."""
    g = torch.Generator().manual_seed(10 + ctx.rank)
    P, n, d = ctx.world_size, 30, 64
    counts = [0 if q == ctx.rank else base + q for q in range(P)]
    recv = [0 if q == ctx.rank else base + ctx.rank for q in range(P)]
    plan = HaloPlan(send_index=torch.randint(0, n, (sum(counts),), generator=g), send_counts=counts,
                    recv_counts=recv)
    raw = torch.randn(n, d, generator=g)
    w = torch.randn(sum(recv), d, generator=g)
    out = {}
    for name in ("dense", "sparse"):
        hooks, sent = bytes_by_class()
        ex = AllToAllHalo(ctx, plan, hooks)
        if name == "sparse":
            ex = MaxKRows(ex, k=k, sparse_layers={1}, forward_bits=bits, backward_bits=bits)
            ex.set_epoch(0, exact=guard)
        if rate < 1:  # boundary sampling on top: the same seeded sample both ways
            ex = Sampled(ex, rate=rate, seed=5, rank=ctx.rank)
            ex.set_epoch(1, exact=False)
        x = raw.clone().requires_grad_(True)
        halo = ex.exchange(maxk(x, k), 1, kind="halo_fwd")
        (halo * w).sum().backward()
        out[name] = {"halo": halo.detach(), "grad": x.grad.clone(), "sent": sent}
    return out


@pytest.mark.timeout(120)
def test_the_sparse_exchange_equals_the_dense_exchange_of_the_masked_rows(tmp_path):
    from helpers import run_on_ranks

    k, d = 8, 64
    for r, res in enumerate(run_on_ranks(exchange_rank, 3, tmp_path, k, 32, timeout_s=90)):
        dense, sparse = res["dense"], res["sparse"]
        assert torch.equal(sparse["halo"], dense["halo"])  # exact in fp32
        assert torch.equal(sparse["grad"], dense["grad"])  # after MaxK's backward mask: the same gradient
        rows_out = sum(7 + q for q in range(3) if q != r)
        assert sparse["sent"]["halo_fwd"] == rows_out * (k * 1 + 4 * k)  # uint8 index + fp32 value
        assert dense["sent"]["halo_fwd"] == rows_out * 4 * d
        rows_back = 2 * (7 + r)  # the gradients of the rows it received, k values each
        assert sparse["sent"]["halo_bwd"] == rows_back * 4 * k and dense["sent"]["halo_bwd"] == rows_back * 4 * d


@pytest.mark.timeout(120)
def test_a_rank_with_no_rows_to_send_takes_part(tmp_path):
    """Rank 1 sends nothing and rank 0 receives nothing (an empty payload must still enter
    the collective), at fp32 and 8-bit values."""
    from helpers import run_on_ranks

    for bits in (32, 8):
        (tmp_path / str(bits)).mkdir()
        res = run_on_ranks(exchange_rank, 2, tmp_path / str(bits), 8, bits, 1.0, 0, timeout_s=90)
        assert res[0]["sparse"]["halo"].shape == (0, 64) and res[1]["sparse"]["halo"].shape == (1, 64)
        dense, sparse = res[1]["dense"]["halo"], res[1]["sparse"]["halo"]
        rng = (dense.max(1).values - dense.min(1).values).clamp_min(1e-12)
        assert ((sparse - dense).abs().max(1).values <= (0 if bits == 32 else rng / 255 + 1e-6)).all()
        assert torch.equal(res[0]["sparse"]["grad"] != 0, res[0]["dense"]["grad"] != 0)


@pytest.mark.timeout(120)
def test_a_guard_epoch_sends_the_values_exact(tmp_path):
    """``exact_every``'s guard epochs: 4-bit values travel as fp32, so the pairs are exact."""
    from helpers import run_on_ranks

    k = 8
    for r, res in enumerate(run_on_ranks(exchange_rank, 2, tmp_path, k, 4, 1.0, 7, True, timeout_s=90)):
        dense, sparse = res["dense"], res["sparse"]
        assert torch.equal(sparse["halo"], dense["halo"]) and torch.equal(sparse["grad"], dense["grad"])
        assert sparse["sent"]["halo_fwd"] == (7 + (1 - r)) * (k + 4 * k) and sparse["sent"]["halo_bwd"] == (7 + r) * 4 * k


@pytest.mark.timeout(120)
def test_maxk_messages_compose_with_boundary_sampling(tmp_path):
    from helpers import run_on_ranks

    for res in run_on_ranks(exchange_rank, 2, tmp_path, 8, 32, 0.5, timeout_s=90):
        dense, sparse = res["dense"], res["sparse"]
        assert torch.equal(sparse["halo"], dense["halo"]) and torch.equal(sparse["grad"], dense["grad"])
        assert 0 < sparse["sent"]["halo_fwd"] < dense["sent"]["halo_fwd"] / 5


@pytest.mark.timeout(120)
def test_quantized_values_stay_within_one_step(tmp_path):
    from helpers import run_on_ranks

    from commgnn.comm import quant

    k = 8
    for r, res in enumerate(run_on_ranks(exchange_rank, 2, tmp_path, k, 8, timeout_s=90)):
        dense, sparse = res["dense"]["halo"], res["sparse"]["halo"]
        assert torch.equal(sparse != 0, dense != 0) or ((sparse != 0) <= (dense != 0)).all()
        rng = (dense.max(1).values - dense.min(1).values).clamp_min(1e-12)  # a row's value range bounds a step
        assert ((sparse - dense).abs().max(1).values <= rng / 255 + 1e-6).all()
        assert not torch.equal(sparse, dense)  # the values did travel at 8 bits, not as fp32
        rows_out = 7 + (1 - r)  # rank r sends 7 + q rows to its peer q
        assert res["sparse"]["sent"]["halo_fwd"] == rows_out * (k + quant.bytes_per_row(k, 8))  # uint8 index + codes


def adaptive_rank(ctx, k: int, budget: float, epochs: int):
    """MaxK pairs whose values the adaptive solver sizes (re-solved every 2 epochs under
    ``budget`` bytes per rank and epoch), beside the dense exchange of the same masked rows;
    the last epoch is a guard epoch (exact). Rank r sends ``7 + q`` rows to peer q."""
    from commgnn.comm.halo.adaptive import AdaptiveQuantized

    g = torch.Generator().manual_seed(20 + ctx.rank)
    P, n, d = ctx.world_size, 30, 64
    counts = [0 if q == ctx.rank else 7 + q for q in range(P)]
    recv = [0 if q == ctx.rank else 7 + ctx.rank for q in range(P)]
    plan = HaloPlan(send_index=torch.randint(0, n, (sum(counts),), generator=g), send_counts=counts,
                    recv_counts=recv)
    hooks, sent = bytes_by_class()
    ada = AdaptiveQuantized(AllToAllHalo(ctx, plan, hooks), ctx=ctx, hooks=hooks, num_layers=2, budget_bytes=budget,
                            every=2, seed=ctx.rank)
    ex = MaxKRows(ada, k=k, sparse_layers={1})
    dense_ex = AllToAllHalo(ctx, plan, bytes_by_class()[0])
    rows = []
    for epoch in range(epochs):
        exact = epoch == epochs - 1
        ex.set_epoch(epoch, exact=exact)
        before = dict(sent)
        # rows on scales a decade apart per peer block, so that the peers' errors differ
        raw = torch.randn(n, d, generator=g) * 10.0 ** torch.randint(-1, 2, (n, 1), generator=g)
        w = torch.randn(sum(recv), d, generator=g)
        got = {}
        for name, lever in (("sparse", ex), ("dense", dense_ex)):
            x = raw.clone().requires_grad_(True)
            halo = lever.exchange(maxk(x, k), 1, kind="halo_fwd")
            (halo * w).sum().backward()
            got[name] = (halo.detach(), x.grad.clone())
        rows.append({"halo": got["sparse"][0], "dense": got["dense"][0], "grad": got["sparse"][1],
                     "dense_grad": got["dense"][1], "exact": exact, "log": ex.epoch_log(),
                     "sent": {c: sent.get(c, 0) - before.get(c, 0) for c in ("halo_fwd", "halo_bwd")}})
    return {"epochs": rows, "counts": counts, "recv": recv}


@pytest.mark.timeout(120)
def test_adaptive_widths_size_the_values_of_maxk_pairs(tmp_path):
    """Three ranks: each sender's values decode within the step of the width it chose for
    that peer, the indices are exact, the bytes are the pairs' (indices + codes at each
    width), a solved epoch fits the budget, and a guard epoch sends exact fp32 pairs."""
    from helpers import run_on_ranks

    from commgnn.comm import quant

    k, epochs = 8, 7
    # per rank and epoch: all values at 1 bit ~415 B, at 8 bits ~640 B (indices included)
    budget = 500.0
    res = run_on_ranks(adaptive_rank, 3, tmp_path, k, budget, epochs, timeout_s=90)
    used = set()
    for me, r in enumerate(res):
        for e, row in enumerate(r["epochs"]):
            if row["exact"]:
                assert torch.equal(row["halo"], row["dense"]) and torch.equal(row["grad"], row["dense_grad"])
                assert row["sent"]["halo_fwd"] == sum(r["counts"]) * (k + 4 * k)
                continue
            fwd = row["log"]["bits"]["1.fwd"]
            for q, (out, truth) in enumerate(zip(row["halo"].split(r["recv"]), row["dense"].split(r["recv"]))):
                if not len(out):
                    continue
                b = res[q]["epochs"][e]["log"]["bits"]["1.fwd"][me]  # the sender's width towards me
                used.add((e >= 2, b))
                assert ((out != 0) <= (truth != 0)).all()  # values only where the sender's top-k was
                kept = torch.where(truth != 0, truth, torch.nan)
                step = (kept.nan_to_num(-torch.inf).amax(1) - kept.nan_to_num(torch.inf).amin(1)) / ((1 << b) - 1)
                assert ((out - truth).abs() <= step[:, None] + 1e-4).all(), (me, q, e, b)
            assert ((row["grad"] != 0) <= (row["dense_grad"] != 0)).all()  # gradients only at the kept entries
            bwd = row["log"]["bits"]["1.bwd"]
            expect_fwd = sum(n * (k + quant.bytes_per_row(k, fwd[q])) for q, n in enumerate(r["counts"]))
            expect_bwd = sum(n * quant.bytes_per_row(k, bwd[q]) for q, n in enumerate(r["recv"]))
            assert row["sent"] == {"halo_fwd": expect_fwd, "halo_bwd": expect_bwd}, (me, e)
            if e >= 2:
                assert expect_fwd + expect_bwd <= budget, (me, e, expect_fwd + expect_bwd)
    assert {b for late, b in used if not late} == {8}  # until the first solve
    assert len({b for late, b in used if late}) >= 2 and min(b for late, b in used if late) < 8, used


def test_maxk_pairs_need_the_solver_right_below():
    """A lever between MaxKRows and the solver would see (index, value) bytes: refused."""
    from commgnn.comm.halo.adaptive import AdaptiveQuantized
    from commgnn.distributed.context import DistContext
    from commgnn.distributed.events import Hooks

    ctx = DistContext.single()
    plan = HaloPlan(send_index=torch.zeros(0, dtype=torch.long), send_counts=[0], recv_counts=[0])
    ada = AdaptiveQuantized(AllToAllHalo(ctx, plan, Hooks()), ctx=ctx, hooks=Hooks(), num_layers=2,
                            budget_bytes=1.0, every=2, seed=0)
    assert MaxKRows(ada, k=4, sparse_layers={1}).adaptive is ada
    with pytest.raises(ValueError, match="directly"):
        MaxKRows(Sampled(ada, rate=0.5, seed=0, rank=0), k=4, sparse_layers={1})


@pytest.mark.timeout(120)
@pytest.mark.slow  # CI time (9 s): the budget solver's MaxK pricing is unit-tested in this file
def test_a_maxk_model_trains_under_an_adaptive_byte_budget(tmp_path):
    """End to end on 2 ranks: from the first solve on, the busiest rank's training halo bytes
    (dense layer-0 rows and layer 1's pairs) stay within the budget, below the 8-bit start."""
    toml = tmp_path / "s.toml"
    toml.write_text("[data.synthetic]\nnum_nodes = 2000\n")
    budget = 50_000  # bytes per rank and epoch; 8 bits everywhere is ~76 kB here
    subprocess.run([sys.executable, "-m", "commgnn", "train", "--config", str(toml), "--parts", "2", "--epochs", "5",
                    "--hidden", "64", "--activation", "maxk", "--maxk-k", "8", "--bits", "adaptive", "--budget-mb",
                    str(budget / 1e6), "--adapt-every", "2", "--quiet", "--out", str(tmp_path / "run")],
                   check=True, capture_output=True, timeout=100)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    spent = [r["bytes_max_rank"]["halo_fwd"] + r["bytes_max_rank"]["halo_bwd"] for r in rows]
    assert spent[0] > budget and all(b <= budget for b in spent[2:]), spent
    assert min(min(w) for w in rows[-1]["bits"].values()) < 8 and "1.fwd" in rows[-1]["bits"]


@pytest.mark.slow  # two 20-epoch runs; the exchange tests above cover values, gradients and bytes
@pytest.mark.timeout(180)
def test_a_maxk_model_trains_with_fewer_halo_bytes(tmp_path):
    toml = tmp_path / "s.toml"
    toml.write_text("[data.synthetic]\nnum_nodes = 2000\n")
    runs = {}
    for act in ("relu", "maxk"):
        out = tmp_path / act
        subprocess.run([sys.executable, "-m", "commgnn", "train", "--config", str(toml), "--parts", "2", "--epochs",
                        "20", "--hidden", "128", "--activation", act, "--maxk-k", "16", "--quiet", "--out", str(out)],
                       check=True, capture_output=True, timeout=150)
        runs[act] = json.loads((out / "summary.json").read_text())
    relu, mk = runs["relu"], runs["maxk"]
    assert mk["halo_bytes_per_epoch"] < 0.75 * relu["halo_bytes_per_epoch"]  # layer 1 rows: 80 B instead of 512 B
    assert mk["best_val_acc"] > relu["best_val_acc"] - 0.05
