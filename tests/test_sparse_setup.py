"""The one-time setup exchange of constant input rows, sent sparse: lossless, never larger
than dense plus one byte per peer, counted byte for byte, and the same training."""

from __future__ import annotations

import pytest
import torch

from commgnn.comm.halo.alltoall import AllToAllHalo
from commgnn.comm.halo.protocol import HaloPlan
from commgnn.comm.halo.sparse_setup import SparseSetup
from commgnn.comm.sparse_codec import (BINARY, BITMAP, BITMAP_VALUES, DENSE, VALUES, block_bytes, decode_block,
                                      encode_block)
from helpers import bytes_by_class


def _rows(kind: str, n: int, d: int, g: torch.Generator, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    x = (torch.rand(n, d, generator=g) < 0.04).to(dtype)
    if kind == "values":
        x = x * torch.randn(n, d, generator=g, dtype=dtype)
    elif kind == "dense":
        x = torch.randn(n, d, generator=g, dtype=dtype)
    return x


@pytest.mark.parametrize("d", [3, 256, 257, 32768, 32769])
@pytest.mark.parametrize("kind,fmt", [("binary", BINARY), ("values", VALUES), ("dense", DENSE)])
def test_blocks_round_trip_bit_for_bit_in_the_smallest_format(d, kind, fmt):
    g = torch.Generator().manual_seed(d)
    n = 2 if d > 1000 else 9
    for dtype in (torch.float32, torch.float64):
        x = _rows(kind, n, d, g, dtype)
        if kind != "dense":  # (an all-zero row in a 2-row dense block would make sparse cheaper)
            x[0] = 0  # an all-zero row
        payload = encode_block(x)
        y = decode_block(payload, n, d, dtype)
        assert y.dtype == dtype and torch.equal(y, x)
        dense = 1 + x.numel() * x.element_size()
        assert payload.numel() <= dense
        if d > 8:  # at 3 columns a sparse row costs more than a dense one, so the block stays dense
            assert int(payload[0]) == fmt
        if fmt == BINARY and d > 8:  # counts + indices only
            z = int((x != 0).sum())
            cb = 1 if d <= 255 else (2 if d <= 32767 else 4)
            ib = 1 if d <= 256 else (2 if d <= 32768 else 4)
            assert payload.numel() == 1 + n * cb + z * ib


@pytest.mark.parametrize("d", [9, 767])
def test_denser_rows_travel_as_bitmaps(d):
    g = torch.Generator().manual_seed(d)
    x = (torch.rand(6, d, generator=g) < 0.35).float()
    x[2] = 0
    for fmt, rows in ((BITMAP, x), (BITMAP_VALUES, x * torch.randn(6, d, generator=g))):
        payload = encode_block(rows)
        assert int(payload[0]) == fmt and torch.equal(decode_block(payload, 6, d, rows.dtype), rows)
        z = int((rows != 0).sum())
        assert payload.numel() == 1 + 6 * -(-d // 8) + (0 if fmt == BITMAP else 4 * z)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_nans_come_back_bit_for_bit_and_a_negative_zero_as_zero(dtype):
    x = torch.zeros(5, 300, dtype=dtype)
    x[0, 3], x[1, 7], x[2, 9], x[3, 1] = -0.0, float("nan"), 1.0, -2.5
    x = x.t().contiguous().t()  # a non-contiguous input
    payload = encode_block(x)
    y = decode_block(payload, 5, 300, dtype)
    bits = {torch.float32: torch.int32, torch.float64: torch.int64, torch.float16: torch.int16,
            torch.bfloat16: torch.int16}[dtype]
    expected = x.clone()
    expected[0, 3] = 0.0  # -0.0 is not sent: it arrives as 0.0
    assert torch.equal(y.contiguous().view(bits), expected.contiguous().view(bits))
    assert block_bytes(x) == payload.numel() == 1 + 5 * 2 + 3 * 2 + 3 * x.element_size()


def test_block_bytes_is_the_encoded_size():
    g = torch.Generator().manual_seed(7)
    for d in (5, 255, 256, 300, 767):
        for kind in ("binary", "values", "dense"):
            x = _rows(kind, 6, d, g)
            assert block_bytes(x) == encode_block(x).numel() and block_bytes(x[:0]) == encode_block(x[:0]).numel()


def test_a_row_wider_than_half_full_stays_dense():
    x = torch.ones(4, 10)
    x[:, 0] = 2.0  # not binary: values cost more than the dense rows
    assert int(encode_block(x)[0]) == DENSE and torch.equal(decode_block(encode_block(x), 4, 10, x.dtype), x)


def exchange_rank(ctx, d: int, kind: str, base: int):
    """Rank r sends ``base + q`` rows to peer q (``base = 0``: rank 0 receives none) of bag-
    of-words (binary), sparse real or dense features; the plain and the sparse setup exchange
    of the same rows, their bytes by class, and a pass-through evaluation exchange."""
    g = torch.Generator().manual_seed(20 + ctx.rank)
    P, n = ctx.world_size, 40
    counts = [0 if q == ctx.rank else base + q for q in range(P)]
    recv = [0 if q == ctx.rank else base + ctx.rank for q in range(P)]
    plan = HaloPlan(send_index=torch.randint(0, n, (sum(counts),), generator=g), send_counts=counts,
                    recv_counts=recv)
    x = _rows(kind, n, d, g)
    out = {}
    for name in ("dense", "sparse"):
        hooks, sent = bytes_by_class()
        ex = AllToAllHalo(ctx, plan, hooks)
        if name == "sparse":
            ex = SparseSetup(ex)
        setup = ex.exchange(x, 0, kind="halo_setup")
        evald = ex.exchange(x, 0, kind="halo_eval")
        expected = sum(encode_block(b).numel() for b, c in zip(x[plan.send_index].split(counts), counts) if c)
        out[name] = {"setup": setup, "eval": evald, "sent": dict(sent), "expected": expected,
                     "peers_out": sum(c > 0 for c in counts)}
    return out


@pytest.mark.timeout(120)
def test_the_sparse_setup_exchange_equals_the_dense_one_and_counts_its_bytes(tmp_path):
    from helpers import run_on_ranks

    for kind in ("binary", "values", "dense"):
        (tmp_path / kind).mkdir()
        for res in run_on_ranks(exchange_rank, 3, tmp_path / kind, 300, kind, 5, timeout_s=90):
            dense, sparse = res["dense"], res["sparse"]
            assert torch.equal(sparse["setup"], dense["setup"]) and torch.equal(sparse["eval"], dense["eval"])
            assert sparse["sent"]["halo_setup"] == sparse["expected"]  # what travelled is what is counted
            assert sparse["sent"]["control"] == 8 * sparse["peers_out"]  # one block size per peer
            assert sparse["sent"]["halo_eval"] == dense["sent"]["halo_eval"]  # evaluation untouched
            ratio = dense["sent"]["halo_setup"] / sparse["sent"]["halo_setup"]
            # 4% of 300 columns: 12 two-byte indices and a 2-byte count per row against 1,200
            # bytes (binary, ~46x); values add 4 bytes each (~14x); dense blocks cost 1 byte more
            assert {"binary": ratio > 30, "values": 8 < ratio < 30, "dense": 0.99 < ratio < 1}[kind]


@pytest.mark.timeout(120)
def test_a_rank_that_receives_nothing_takes_part(tmp_path):
    from helpers import run_on_ranks

    res = run_on_ranks(exchange_rank, 2, tmp_path, 50, "binary", 0, timeout_s=90)
    assert res[0]["sparse"]["setup"].shape == (0, 50) and res[1]["sparse"]["setup"].shape == (1, 50)
    assert torch.equal(res[1]["sparse"]["setup"], res[1]["dense"]["setup"])
    assert res[0]["sparse"]["sent"]["control"] == 8  # one size, to rank 1
    assert res[1]["sparse"]["sent"].get("control", 0) == 0 and res[1]["sparse"]["sent"].get("halo_setup", 0) == 0


@pytest.mark.timeout(180)
def test_precompute_trains_identically_with_a_cheaper_setup(tmp_path):
    """Two ranks, GCN with precompute on a graph with bag-of-words features: the sparse setup
    gives the same losses, accuracies and per-epoch bytes as the dense one, at a fraction of
    the setup bytes."""
    import commgnn
    from commgnn.comm.config import CommConfig, HaloConfig
    from helpers import small_graph

    data = small_graph(n=400, m=2400, f=500, c=4, seed=3)
    g = torch.Generator().manual_seed(3)
    data.x = (torch.rand(data.num_nodes, 500, generator=g) < 0.03).float()
    data.x[torch.arange(data.num_nodes), data.y] = 1.0  # a class word, so that it learns something
    runs = {}
    for sparse in (False, True):
        comm = CommConfig(halo=HaloConfig(precompute=True, sparse_setup=sparse))
        out = tmp_path / str(sparse)
        commgnn.train(data, model="gcn", parts=2, comm=comm, epochs=4, hidden=8, quiet=True, out=out)
        import json

        runs[sparse] = (json.loads((out / "summary.json").read_text()),
                        [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()])
    (sd, md), (ss, ms) = runs[False], runs[True]
    assert [r["loss"] for r in ms] == [r["loss"] for r in md]
    assert ss["test_acc"] == sd["test_acc"] and ss["halo_bytes_per_epoch"] == sd["halo_bytes_per_epoch"]
    assert 0 < ss["setup_bytes"]["halo_setup"] < sd["setup_bytes"]["halo_setup"] / 10
