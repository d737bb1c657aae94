"""The calibration microbenchmark: ping-pong, all-to-all, all-reduce and barrier, fitted.

Written by hand over ``torch.distributed`` point-to-point and ``all_to_all_single``. All
ranks call :func:`calibrate` together. Rank 0 ping-pongs with rank 1 (same host, when a
host has two ranks or more) and with the first rank of host 1 (another host); the one-way
time of ``n`` bytes is half the median round trip. Each link class is fitted to
``alpha + n * beta`` (:func:`commgnn.netmodel.model.fit_link`). Then every rank sends
``n`` bytes to every other rank in one ``all_to_all_single`` (slowest rank's median time),
the sizes' (links' price, measured) pairs are the model's all-to-all curve
(``a2a_points``), and the largest size calibrates ``collective_factor`` (measured over the
links' prediction; files without a curve use it); every size's measurement and prediction
are kept in ``fits`` for the record. Last, every
rank all-reduces ``n`` bytes (float32) at a few sizes, fitted to ``alpha + n * beta`` as
the model's ``allreduce`` (whatever algorithm the backend runs; the links' ring price is
kept beside it in ``fits``); the trainer's scalar all-reduce (4 float64) is timed apart as
``scalar_allreduce_s``, and a barrier as ``barrier_s``. Why apart: a tensor of a few
elements need not cost what the fit gives a few bytes (under gloo it may not; the docs'
cost-model design page gives the measurement). Under NCCL
the buffers are device tensors and every timing waits for the device; under gloo they are
host tensors.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from commgnn.distributed.context import DistContext
from commgnn.netmodel.model import ClusterModel, Link, fit_link

PINGPONG_SIZES = (1_000, 10_000, 100_000, 1_000_000, 4_000_000)
A2A_SIZES = (10_000, 100_000, 1_000_000)
AR_SIZES = (4_000, 100_000, 1_000_000, 4_000_000)
"""All-reduce payloads per rank (bytes, float32), from a bias vector to a large model's
gradient; the slope comes from the two largest, where bytes dominate."""
SCALARS = 4
"""Elements (float64) of the trainer's scalar all-reduce: the loss and three accuracy counts."""


def _reps(nbytes: int) -> int:
    return 20 if nbytes <= 10_000 else 10 if nbytes <= 100_000 else 3


def _settle(dev: torch.device) -> None:
    """Wait for the device: NCCL returns before its transfer is done, so a timer stopped
    without this would measure only the launch."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _pingpong(ctx: DistContext, partner: int, sizes: Sequence[int]) -> list[float]:
    """One-way seconds per size between rank 0 and ``partner`` (meaningful on rank 0)."""
    out, dev = [], ctx.comm_device
    for n in sizes:
        buf = torch.zeros(n, dtype=torch.uint8, device=dev)
        times = []
        for rep in range(_reps(n) + 1):  # the first round trip opens the connection: dropped
            if ctx.rank == 0:
                t0 = time.perf_counter()
                dist.send(buf, partner, group=ctx.group)
                dist.recv(buf, partner, group=ctx.group)
                _settle(dev)
                if rep:
                    times.append((time.perf_counter() - t0) / 2)
            elif ctx.rank == partner:
                dist.recv(buf, 0, group=ctx.group)
                dist.send(buf, 0, group=ctx.group)
                _settle(dev)
        out.append(statistics.median(times) if times else 0.0)
    ctx.barrier()
    return out


def _timed(ctx: DistContext, op: Callable[[], Any], reps: int) -> float:
    """Slowest rank's median seconds of ``op`` (a collective every rank runs), each try
    started from a barrier; the first try (buffers, connections) is dropped."""
    times = []
    for rep in range(reps + 1):
        ctx.barrier()
        t0 = time.perf_counter()
        op()
        _settle(ctx.comm_device)
        if rep:
            times.append(time.perf_counter() - t0)
    t = torch.tensor([statistics.median(times)], dtype=torch.float64)
    return float(ctx.all_reduce(t, "max")[0])


def _all_to_all(ctx: DistContext, sizes: Sequence[int]) -> list[float]:
    """Slowest rank's median seconds of one all-to-all with ``n`` bytes to every peer."""
    P, out, dev = ctx.world_size, [], ctx.comm_device
    for n in sizes:
        send = torch.zeros(n * P, dtype=torch.uint8, device=dev)
        recv = torch.empty_like(send)
        out.append(_timed(ctx, lambda: dist.all_to_all_single(recv, send, group=ctx.group), _reps(n)))
    return out


def _all_reduce(ctx: DistContext, sizes: Sequence[int]) -> list[float]:
    """Slowest rank's median seconds of one all-reduce of ``n`` bytes (float32) per size
    (at least 10 tries up to 1 MB and 5 above: on fast links the fit's slope is a small
    difference of two medians)."""
    out = []
    for n in sizes:
        buf = torch.zeros(max(n // 4, 1), dtype=torch.float32, device=ctx.comm_device)
        reps = max(_reps(n), 10 if n <= 1_000_000 else 5)
        out.append(_timed(ctx, lambda: dist.all_reduce(buf, group=ctx.group), reps))
    return out


def calibrate(ctx: DistContext, ranks_per_host: int, *, sizes: Sequence[int] = PINGPONG_SIZES,
              a2a_sizes: Sequence[int] = A2A_SIZES, ar_sizes: Sequence[int] = AR_SIZES) -> ClusterModel:
    """Measure and fit this job's links (all ranks call it; every rank gets the model)."""
    P, R = ctx.world_size, ranks_per_host
    if P < 2:
        raise ValueError("calibration needs at least 2 ranks")
    if P % R:
        raise ValueError(f"{P} ranks do not split into hosts of {R}")
    H = P // R
    fits: dict[str, Any] = {"sizes": list(sizes)}
    links: dict[str, Link] = {}
    for name, partner in (("intra", 1 if R > 1 else None), ("inter", R if H > 1 else None)):
        if partner is None:
            continue
        one_way = _pingpong(ctx, partner, sizes)
        t = torch.tensor(one_way, dtype=torch.float64)
        ctx.all_reduce(t, "max")  # rank 0's numbers to everyone (the others hold zeros)
        link, resid = fit_link(sizes, t.tolist())
        links[name] = link
        fits[name] = {"one_way_s": t.tolist(), "max_rel_residual": resid}
    intra = links.get("intra", links.get("inter"))
    inter = links.get("inter", links.get("intra"))
    assert intra is not None and inter is not None
    links_only = ClusterModel(hosts=H, ranks_per_host=R, intra=intra, inter=inter)
    measured = _all_to_all(ctx, a2a_sizes)
    matrices = [torch.full((P, P), float(n)).fill_diagonal_(0) for n in a2a_sizes]
    latency = links_only.collective_s(torch.zeros(P, P))
    # the factor from the largest size, where the volume term dominates
    factor = max((measured[-1] - latency) / max(links_only.collective_s(matrices[-1]) - latency, 1e-12), 0.1)
    model = replace(links_only, collective_factor=factor, source="calibrated", fits=fits)
    links_s = [links_only.collective_s(B) for B in matrices]
    fits["all_to_all"] = {"sizes": list(a2a_sizes), "measured_s": measured,
                          "predicted_s": [model.collective_s(B) for B in matrices],  # by the one factor
                          "links_only_s": links_s}
    model = replace(model, a2a_points=tuple(sorted(zip(links_s, measured))))
    ar = _all_reduce(ctx, ar_sizes)
    allreduce, resid = fit_link(ar_sizes, ar)
    scalars = torch.zeros(SCALARS, dtype=torch.float64, device=ctx.comm_device)
    scalar = _timed(ctx, lambda: dist.all_reduce(scalars, group=ctx.group), _reps(0))
    barrier = _timed(ctx, ctx.barrier, _reps(0))
    fits["all_reduce"] = {"sizes": list(ar_sizes), "measured_s": ar, "max_rel_residual": resid,
                          "ring_s": [links_only.allreduce_s(n) for n in ar_sizes]}
    fits["scalar_all_reduce"] = {"elements": SCALARS, "measured_s": scalar,
                                 "ring_s": links_only.allreduce_s(8.0 * SCALARS)}
    fits["barrier"] = {"measured_s": barrier, "ring_s": links_only.allreduce_s(0.0)}
    return replace(model, allreduce=allreduce, scalar_allreduce_s=scalar, barrier_s=barrier)
