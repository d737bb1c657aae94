"""The alpha-beta cost model: arithmetic, fits, prediction from a run's records, calibration."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from commgnn.netmodel import ClusterModel, Link, fit_link

INTER = Link(alpha_s=1e-4, beta_s=8e-8)  # 100 Mbit/s
INTRA = Link(alpha_s=1e-5, beta_s=8e-10)  # 10 Gbit/s


def model(hosts=2, r=2, factor=1.0) -> ClusterModel:
    return ClusterModel(hosts=hosts, ranks_per_host=r, intra=INTRA, inter=INTER, collective_factor=factor)


def test_a_collective_is_priced_at_the_busiest_host_port():
    B = torch.zeros(4, 4)
    B[0, 2] = 1e6  # host 0 -> host 1
    B[1, 3] = 2e6  # host 0 -> host 1: shares host 0's port with the first
    B[3, 0] = 5e5  # host 1 -> host 0
    B[0, 1] = 9e6  # inside host 0
    m = model()
    expect = INTER.alpha_s + max(3e6 * INTER.beta_s, 9e6 * INTRA.beta_s)
    assert m.collective_s(B) == pytest.approx(expect)
    assert model(factor=1.5).collective_s(B) == pytest.approx(INTER.alpha_s + 1.5 * 3e6 * INTER.beta_s)
    # two ring all-reduce steps per rank: 2 (P - 1) latencies
    assert m.collective_s(B, steps=6) == pytest.approx(6 * INTER.alpha_s + 3e6 * INTER.beta_s)


def test_ring_pairs_price_an_all_reduce_like_the_ring_formula():
    m, n, P = model(hosts=4, r=1), 4e6, 4
    ring = torch.zeros(P, P)
    ring[torch.arange(P), (torch.arange(P) + 1) % P] = 2 * (P - 1) / P * n  # how runs record it
    assert m.collective_s(ring, steps=2 * (P - 1)) == pytest.approx(m.allreduce_s(n))
    # hierarchical: the slow links carry a ring over hosts only
    h = model(hosts=2, r=4)
    assert h.allreduce_s(n, hierarchical=True) == pytest.approx(
        6 * INTRA.alpha_s + 1.5 * n * INTRA.beta_s + 2 * INTER.alpha_s + n * INTER.beta_s)
    assert h.allreduce_s(n, hierarchical=True) < h.allreduce_s(n)


def test_an_epoch_is_compute_plus_each_class_collectives():
    m = model()
    B = torch.full((4, 4), 1e5).fill_diagonal_(0)
    pred = m.predict_epoch(0.5, {"halo_fwd": B * 2, "grad_sync": B}, {"halo_fwd": 2, "grad_sync": -1})
    assert pred["halo_fwd"] == pytest.approx(2 * m.collective_s(B))
    assert pred["grad_sync"] == pytest.approx(m.collective_s(B, steps=6))
    assert pred["epoch"] == pytest.approx(0.5 + pred["halo_fwd"] + pred["grad_sync"])


def test_a_pipelined_exchange_hides_behind_compute_up_to_the_compute_time():
    m = model()
    B = torch.full((4, 4), 1e5).fill_diagonal_(0)
    pairs, calls = {"halo_fwd": B, "grad_sync": B}, {"halo_fwd": 1, "grad_sync": -1}
    halo = m.collective_s(B)
    plain = m.predict_epoch(0.5, pairs, calls)
    for compute in (halo / 2, 2 * halo):  # the exchange longer, then shorter, than compute
        hid = m.predict_epoch(compute, pairs, calls, overlap=("halo_fwd", "halo_bwd"))
        assert hid["hidden"] == pytest.approx(min(compute, halo)) and hid["comm"] == pytest.approx(plain["comm"])
        assert hid["epoch"] == pytest.approx(compute + hid["grad_sync"] + max(0.0, halo - compute))
    assert plain["hidden"] == 0.0 and plain["epoch"] == pytest.approx(0.5 + plain["comm"])


AR = Link(alpha_s=2e-3, beta_s=3e-8)  # a backend's all-reduce, as calibrated


def test_a_calibrated_all_reduce_prices_grad_and_control_by_its_fit_and_barriers_apart():
    """With a measured all-reduce, ``k`` all-reduces that put ``B`` on the ring pairs cost
    ``k alpha + n beta`` for the per-rank payload ``n = max_s B[s] P / (2 (P - 1))``,
    however the bytes split among the calls; ``control``'s scalar all-reduce its own
    measured time; a barrier ``barrier_s`` (else an empty all-reduce). Without them, the
    ring over the links prices all of it as before."""
    from dataclasses import replace

    ring_only = model(hosts=2, r=2)
    m = replace(ring_only, allreduce=AR, barrier_s=1.5e-3, scalar_allreduce_s=4e-4)
    P, n = 4, 4e5
    ring = torch.zeros(P, P)
    ring[torch.arange(P), (torch.arange(P) + 1) % P] = 2 * (P - 1) / P * n
    pred = m.predict_epoch(0.1, {"grad_sync": 3 * ring, "control": ring / 1e4}, {"grad_sync": -3, "control": -1},
                           barriers=1)
    assert pred["grad_sync"] == pytest.approx(3 * AR.alpha_s + 3 * n * AR.beta_s)
    assert pred["control"] == 4e-4  # the calibrated scalar all-reduce
    assert replace(m, scalar_allreduce_s=None).predict_epoch(
        0.1, {"control": ring / 1e4}, {"control": -1})["control"] == pytest.approx(AR.time(n / 1e4))
    assert pred["barrier"] == 1.5e-3
    assert pred["epoch"] == pytest.approx(0.1 + pred["grad_sync"] + 4e-4 + 1.5e-3)
    assert m.allreduce_s(n) == pytest.approx(AR.time(n))
    # hierarchical stays a price from the links; no barrier_s: an empty all-reduce
    assert m.allreduce_s(n, hierarchical=True) == pytest.approx(ring_only.allreduce_s(n, hierarchical=True))
    assert replace(m, barrier_s=None).barrier_time() == pytest.approx(AR.alpha_s)
    old = ring_only.predict_epoch(0.1, {"grad_sync": ring}, {"grad_sync": -1}, barriers=2)
    assert old["grad_sync"] == pytest.approx(ring_only.collective_s(ring, steps=2 * (P - 1)))
    assert old["barrier"] == pytest.approx(2 * 2 * (P - 1) * INTER.alpha_s)
    again = ClusterModel.from_dict(json.loads(json.dumps(m.to_dict())))
    assert again == m and again.allreduce == AR


@pytest.mark.parametrize("grad, steps, per_step", [
    ({}, 100, 1.0),
    ({"strategy": "fp16"}, 100, 2.0),                   # the prescale's scalar all-reduce
    ({"strategy": "fp16", "prescale": False}, 100, 1.0),
    ({"strategy": "powersgd", "start_iter": 10}, 100, (10 + 3 * 90) / 100),  # rank-1 tensors, P, Q
    ({"strategy": "powersgd", "start_iter": 10, "half": True}, 100, (10 + 4 * 90) / 100),
    ({"strategy": "powersgd", "start_iter": 50}, 20, 1.0),  # never left the plain steps
    ({"strategy": "localsgd", "start_iter": 10, "period": 4}, 50, (10 + 40 / 4) / 50),
    ({"strategy": "topk"}, 100, 1.0),
])
def test_gradient_strategies_count_their_all_reduces_per_step(grad, steps, per_step):
    from commgnn.netmodel.predict import grad_allreduces_per_step

    assert grad_allreduces_per_step(grad, steps) == pytest.approx(per_step)


def test_a_powersgd_runs_grad_sync_is_priced_as_three_all_reduces_a_step(tmp_path):
    from dataclasses import replace

    from commgnn.netmodel.predict import per_epoch_traffic, predict_run

    run = _run_dir(tmp_path)
    (run / "config.toml").write_text('[model]\nlayers = 2\n[comm.grad]\nstrategy = "powersgd"\nstart_iter = 2\n')
    pairs, calls = per_epoch_traffic(run)
    assert calls["grad_sync"] == pytest.approx(-(2 * 1) / 2)  # 2 epochs, both plain steps
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() * 5]  # 10 epochs
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pairs, calls = per_epoch_traffic(run)
    assert calls["grad_sync"] == pytest.approx(-(2 + 3 * 8) / 10)
    m = replace(model(hosts=1, r=2), allreduce=AR, barrier_s=1e-3)
    pred = predict_run(run, m)
    n = float(pairs["grad_sync"].sum(1).max())  # P = 2: the ring share is the payload
    assert pred["by_class_s"]["grad_sync"] == pytest.approx(2.6 * AR.alpha_s + n * AR.beta_s)
    assert pred["by_class_s"]["barrier"] == 1e-3  # a full-graph epoch's one barrier


def test_a_calibrated_all_to_all_is_priced_on_the_measured_curve():
    """Between calibrated sizes the links' price is interpolated on the (price, measured)
    points; past the largest the last slope goes on; below the smallest, its excess over
    the price is added when positive. Old files get the curve from their record."""
    from dataclasses import replace

    from commgnn.netmodel.model import on_curve

    pts = ((0.002, 0.006), (0.02, 0.018), (0.2, 0.25))  # small: software; mid: a burst; large: x1.25
    assert on_curve(0.011, pts) == pytest.approx(0.012)
    assert on_curve(0.2, pts) == pytest.approx(0.25) and on_curve(0.38, pts) == pytest.approx(0.25 + 0.18 * 0.232 / 0.18)
    assert on_curve(0.001, pts) == pytest.approx(0.001 + 0.004)
    assert on_curve(0.001, ((0.002, 0.001), (0.02, 0.03))) == pytest.approx(0.001)  # faster than priced: the price
    m = model(hosts=2, r=2)
    B = torch.full((4, 4), 1e5).fill_diagonal_(0)
    price = m.collective_s(B)
    curved = replace(m, a2a_points=((price / 2, price), (price * 2, price * 3)))
    assert curved.collective_s(B) == pytest.approx(on_curve(price, curved.a2a_points))
    assert curved.collective_s(B, steps=6) == pytest.approx(m.collective_s(B, steps=6))  # rings keep the factor
    d = {**replace(m, source="calibrated").to_dict(), "fits": {"all_to_all": {
        "measured_s": [0.3, 0.01], "links_only_s": [0.2, 0.02]}}}
    del d["a2a_points"]
    assert ClusterModel.from_dict(d).a2a_points == ((0.02, 0.01), (0.2, 0.3))
    again = ClusterModel.from_dict(json.loads(json.dumps(curved.to_dict())))
    assert again == curved


def test_an_overhead_hides_only_behind_the_price_in_excess_of_its_reference_link(tmp_path):
    """A run predicted on the link its residual was measured on, with that residual, comes
    out as measured; on a slower link only the extra price overlaps the residual."""
    from dataclasses import replace

    from commgnn.netmodel.predict import predict_run, residual_s, with_overhead

    assert with_overhead(0.4, 0.3, 0.5, overlappable_s=0.1) == pytest.approx(0.4 + 0.3 - 0.05)
    assert with_overhead(0.4, 0.3, 0.5, overlappable_s=0.0) == pytest.approx(0.7)
    assert with_overhead(0.4, 0.3, 0.5) == pytest.approx(0.4 + 0.3 - 0.15)
    run = _run_dir(tmp_path)  # measured epoch 1.0 s, compute 0.5 s
    ref = model(hosts=1, r=2)
    res = residual_s(run, ref)
    assert res > 0
    assert predict_run(run, ref, overhead_s=res, reference=ref)["predicted_epoch_s"] == pytest.approx(1.0)
    assert predict_run(run, ref, overhead_s=res)["predicted_epoch_s"] < 1.0  # the midpoint alone under-prices it
    slow = replace(ref, intra=Link(alpha_s=1e-3, beta_s=8e-8))
    p = predict_run(run, slow, overhead_s=res, reference=ref)
    link = predict_run(run, slow)["predicted_epoch_s"] - 0.5
    extra = link - (predict_run(run, ref)["predicted_epoch_s"] - 0.5)
    assert p["predicted_epoch_s"] == pytest.approx(0.5 + link + res - 0.5 * min(extra, res))
    with pytest.raises(ValueError, match="ranks"):
        predict_run(run, ref, overhead_s=res, reference=model(hosts=2, r=2))


def test_the_fit_recovers_a_links_alpha_and_beta():
    sizes = [1e3, 1e4, 1e5, 1e6, 4e6]
    link, resid = fit_link(sizes, [INTER.time(n) for n in sizes])
    assert link.alpha_s == pytest.approx(INTER.alpha_s, rel=1e-6) and link.beta_s == pytest.approx(INTER.beta_s)
    assert resid < 1e-9 and link.rate_bps == pytest.approx(1e8)
    burst = [INTER.time(n) * (0.3 if n <= 1e4 else 1.0) for n in sizes]  # a shaper's bucket lends a burst
    assert fit_link(sizes, burst)[0].beta_s == pytest.approx(INTER.beta_s)


def test_a_written_model_round_trips_through_json():
    m = ClusterModel.written(8, 4, 10e9, delay_s=5e-3)
    again = ClusterModel.from_dict(json.loads(json.dumps(m.to_dict())))
    assert again == m and m.inter.alpha_s > 5e-3 and m.inter.rate_bps == pytest.approx(10e9)


@pytest.mark.timeout(120)
@pytest.mark.slow  # heavy on 2 cores; siblings cover the path in CI
def test_calibration_on_local_ranks_writes_a_model(tmp_path):
    out = tmp_path / "net.json"
    subprocess.run([sys.executable, "-m", "commgnn", "calibrate", "--parts", "2", "--sizes", "1000,100000,1000000",
                    "--out", str(out)], check=True, capture_output=True, timeout=100)
    m = ClusterModel.from_dict(json.loads(out.read_text()))
    assert (m.hosts, m.ranks_per_host, m.source) == (1, 2, "calibrated")
    fit = m.fits["intra"]
    assert len(fit["one_way_s"]) == 3 and all(t > 0 for t in fit["one_way_s"])
    a2a = m.fits["all_to_all"]
    assert m.collective_factor >= 0.1
    if m.collective_factor > 0.1:  # not at its floor: the factor fits the largest all-to-all exactly
        assert a2a["predicted_s"][-1] == pytest.approx(a2a["measured_s"][-1], rel=1e-6)
    ar = m.fits["all_reduce"]
    assert ar["sizes"] == [4_000, 100_000, 1_000_000] and all(t > 0 for t in ar["measured_s"])
    assert m.allreduce is not None and m.barrier_s is not None and m.barrier_s > 0
    assert m.scalar_allreduce_s == m.fits["scalar_all_reduce"]["measured_s"] > 0
    # the fit goes through the two largest sizes (the slope between them)
    assert m.allreduce.beta_s == pytest.approx(max((ar["measured_s"][2] - ar["measured_s"][1]) / 900_000, 1e-15))


def test_the_calibration_measures_the_backends_all_reduce_on_gloo_ranks(tmp_path):
    """Two gloo ranks: every rank gets the same fitted all-reduce and barrier, the fit's
    points are the measurements, and the model prices an all-reduce by them."""
    from helpers import run_on_ranks

    got = run_on_ranks(_calibrate_small, 2, tmp_path)
    assert got[0] == got[1]
    m = ClusterModel.from_dict(got[0])
    ar = m.fits["all_reduce"]
    assert ar["sizes"] == [4_000, 20_000, 200_000] and len(ar["measured_s"]) == 3
    assert all(0 < t < 5 for t in ar["measured_s"]) and 0 < m.barrier_s < 5 and 0 < m.scalar_allreduce_s < 5
    assert m.allreduce_s(200_000) == pytest.approx(m.allreduce.time(200_000))
    # alpha: the smallest size's time less its bytes (0 when the slope alone exceeds it)
    assert m.allreduce.alpha_s == pytest.approx(max(ar["measured_s"][0] - 4_000 * m.allreduce.beta_s, 0.0), abs=1e-12)


def _calibrate_small(ctx) -> dict:
    from commgnn.netmodel.calibrate import calibrate

    m = calibrate(ctx, 2, sizes=(1_000, 20_000), a2a_sizes=(1_000, 20_000), ar_sizes=(4_000, 20_000, 200_000))
    return m.to_dict()


def test_projected_traffic_counts_each_layers_rows_at_its_width():
    from commgnn.netmodel.project import Levers, epoch_traffic

    V = torch.tensor([[0, 3], [5, 0]])
    F, h, L = 100, 16, 2
    t = epoch_traffic(V, F=F, h=h, L=L, params=1000, levers=Levers())
    assert t["halo_fwd"][0, 1] == 3 * 4 * (F + h) and t["halo_fwd"][1, 0] == 5 * 4 * (F + h)
    assert t["halo_bwd"][1, 0] == 3 * 4 * h  # layer 1's gradients go back to the owner
    assert t["halo_eval"][0, 1] == 3 * 4 * (F + h)
    assert float(t["grad_sync"].sum()) == pytest.approx(2 * 1 / 2 * 1000 * 4 * 2)  # two ranks' ring shares
    pre = epoch_traffic(V, F=F, h=h, L=L, params=1000, levers=Levers(precompute=True, transform_first=True))
    assert pre["halo_fwd"][0, 1] == 3 * 4 * h and pre["halo_eval"][0, 1] == 3 * 4 * h
    tf = epoch_traffic(V, F=F, h=h, L=L, params=1000, levers=Levers(transform_first=True))
    assert tf["halo_fwd"][0, 1] == 3 * 4 * (h + h)


def _run_dir(tmp_path, *, steps=None, layers=2):
    """A finished run's files as the trainer writes them: 2 ranks, 2 epochs."""
    P, cls = 2, {"halo_fwd": 4e5, "grad_sync": 1e5, "control": 16.0, "fetch_ids": 2e3, "fetch_rows": 6e4,
                 "topology": 3e3}
    pairs = {c: [[0.0, n], [n, 0.0]] for c, n in cls.items()}  # the whole run: 2 epochs of n a rank
    by_layer = {c: {"0": n, "1": n if c == "halo_fwd" else 0, "other": 0} for c, n in cls.items()}
    (tmp_path / "summary.json").write_text(json.dumps({"bytes_by_pair": pairs, "bytes_by_layer": by_layer,
                                                       "peak_rss_mb_by_rank": [1.0] * P}))
    row = {"bytes": {c: n for c, n in cls.items()}, "epoch_s": 1.0,
           "time_busiest_s": {"compute": 0.5, "comm": 0.3}, **({"steps": steps} if steps else {})}
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(row) for _ in range(2)) + "\n")
    (tmp_path / "config.toml").write_text(f"[model]\nlayers = {layers}\n")
    return tmp_path


def test_per_epoch_traffic_counts_collectives_per_epoch_and_per_step(tmp_path):
    from commgnn.netmodel.predict import per_epoch_traffic, predict_run

    (tmp_path / "fg").mkdir()
    pairs, calls = per_epoch_traffic(_run_dir(tmp_path / "fg"))
    assert float(pairs["halo_fwd"].sum()) == pytest.approx(4e5)  # 2 epochs x 2 ranks x n / 2 epochs
    assert calls["halo_fwd"] == 2 and calls["grad_sync"] == -1 and calls["control"] == -1
    (tmp_path / "mb").mkdir()
    mb = _run_dir(tmp_path / "mb", steps=5, layers=3)
    pairs, calls = per_epoch_traffic(mb)
    # mini-batch: every step syncs gradients and runs one fetch round (counts + ids, then rows)
    # and, for owner-side sampling, one request-reply round (3 all-to-alls) per layer
    assert calls["grad_sync"] == -5 and calls["fetch_ids"] == 10 and calls["fetch_rows"] == 5
    assert calls["topology"] == 5 * 3 * 3 and calls["control"] == -1
    m = model(hosts=1, r=2)
    pred = predict_run(mb, m)
    assert pred["by_class_s"]["grad_sync"] == pytest.approx(5 * m.collective_s(pairs["grad_sync"] / 5, steps=2))


def test_a_pipelined_runs_stale_epochs_are_priced_with_their_overlap(tmp_path):
    """Only epochs that ran stale (background time logged) overlap; the mean is taken over
    the epochs the comparison uses (2..n), and a run without pipelining is unchanged."""
    from commgnn.netmodel.predict import per_epoch_traffic, predict_run

    run = _run_dir(tmp_path)
    m = model(hosts=1, r=2)
    plain = predict_run(run, m)
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() * 2]  # 4 epochs
    for r, overlap in zip(rows, (0.0, 0.2, 0.0, 0.2)):  # epochs 2 and 4 ran stale
        r["time_busiest_s"] = {**r["time_busiest_s"], "overlap": overlap}
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert predict_run(run, m)["predicted_epoch_s"] == pytest.approx(plain["predicted_epoch_s"])  # not pipelined
    (run / "config.toml").write_text('[model]\nlayers = 2\n[comm.halo.staleness]\nmode = "pipeline"\n')
    pred = predict_run(run, m)
    pairs, calls = per_epoch_traffic(run)
    hidden = min(0.5, m.predict_epoch(0.5, pairs, calls)["halo_fwd"])
    assert hidden > 0 and pred["predicted_hidden_s"] == pytest.approx(hidden * 2 / 3)  # 2 of epochs 2-4
    assert pred["predicted_epoch_s"] == pytest.approx(plain["predicted_epoch_s"] - hidden * 2 / 3)
    # the epoch log's flag decides where it is written: exact epochs also run their
    # exchange on the pipeline's thread (background time) but hide nothing
    for r, stale in zip(rows, (False, False, False, True)):
        r["stale_epoch"] = stale
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert predict_run(run, m)["predicted_hidden_s"] == pytest.approx(hidden / 3)


def test_the_residual_of_a_reference_run_carries_to_another_link(tmp_path):
    """``residual_s`` is what the reference link's model leaves unexplained (measured epoch
    less predicted, never below 0); ``predict_run(..., overhead_s=r)`` joins it to the
    priced link time: added at overlap 0, the larger at 1, their midpoint by default."""
    from commgnn.netmodel.predict import OVERLAP, predict_run, residual_s

    run = _run_dir(tmp_path)  # epochs of 1.0 s measured, 0.5 s of it compute
    fast = model(hosts=1, r=2)
    plain = predict_run(run, fast)
    r = residual_s(run, fast)
    assert r == pytest.approx(1.0 - plain["predicted_epoch_s"]) and r > 0
    slow = model(hosts=2, r=1)
    on_slow = predict_run(run, slow)
    link = on_slow["predicted_epoch_s"] - on_slow["compute_s"]  # nothing pipelined: all exposed
    assert link > 0 and on_slow["predicted_hidden_s"] == 0
    added = predict_run(run, slow, overhead_s=r, overlap=0.0)
    assert added["predicted_epoch_s"] == pytest.approx(on_slow["predicted_epoch_s"] + r)
    larger = predict_run(run, slow, overhead_s=r, overlap=1.0)
    assert larger["predicted_epoch_s"] == pytest.approx(on_slow["compute_s"] + max(link, r))
    with_r = predict_run(run, slow, overhead_s=r)
    assert OVERLAP == 0.5
    assert with_r["predicted_epoch_s"] == pytest.approx(on_slow["predicted_epoch_s"] + r - 0.5 * min(link, r))
    assert larger["predicted_epoch_s"] < with_r["predicted_epoch_s"] < added["predicted_epoch_s"]
    assert with_r["overhead_s"] == r and with_r["predicted_comm_s"] == on_slow["predicted_comm_s"]
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError):
            predict_run(run, slow, overhead_s=r, overlap=bad)
    # a reference link priced above what the run measured leaves nothing to carry over
    dear = ClusterModel(hosts=1, ranks_per_host=2, intra=Link(alpha_s=1.0, beta_s=1e-3), inter=INTER)
    assert predict_run(run, dear)["predicted_epoch_s"] > 1.0 and residual_s(run, dear) == 0.0
    for bad in (-0.1, float("nan")):
        with pytest.raises(ValueError):
            predict_run(run, slow, overhead_s=bad)


def test_with_overhead_lies_between_the_sum_and_the_larger():
    """The overlap rule: 0 adds, 1 takes the larger, anything between interpolates; a
    residual of 0 leaves the link time alone whatever the overlap."""
    from commgnn.netmodel.predict import with_overhead

    for link, res in ((3.0, 1.0), (0.2, 0.9), (0.5, 0.5), (0.0, 0.4)):
        assert with_overhead(link, res, 0.0) == pytest.approx(link + res)
        assert with_overhead(link, res, 1.0) == pytest.approx(max(link, res))
        assert with_overhead(link, res, 0.5) == pytest.approx((link + res + max(link, res)) / 2)
        assert with_overhead(link, 0.0, 0.7) == pytest.approx(link)
