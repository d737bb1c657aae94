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

    for halo, what in (({"staleness": {"mode": "pipeline"}}, "staleness"), ({"bits": "adaptive", "budget_mb": 1.0},
                                                                            "adaptive bit-width solver")):
        with pytest.raises(ConfigError, match=what):
            from_dict(RunConfig, {"model": {"activation": "maxk"}, "comm": {"halo": halo}})


def exchange_rank(ctx, k: int, bits: int, rate: float = 1.0, base: int = 7):
    """Dense and sparse exchange of the same MaxK rows on every rank: values and gradients.
    Rank r sends ``base + q`` rows to peer q (``base = 0``: rank 0 receives none)."""
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
