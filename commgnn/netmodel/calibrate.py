"""The calibration microbenchmark: ping-pong and all-to-all at several sizes, fitted.

Written by hand over ``torch.distributed`` point-to-point and ``all_to_all_single``. All
ranks call :func:`calibrate` together. Rank 0 ping-pongs with rank 1 (same host, when a
host has two ranks or more) and with the first rank of host 1 (another host); the one-way
time of ``n`` bytes is half the median round trip. Each link class is fitted to
``alpha + n * beta`` (:func:`commgnn.netmodel.model.fit_link`). Then every rank sends
``n`` bytes to every other rank in one ``all_to_all_single`` (slowest rank's median time),
the largest size calibrates ``collective_factor`` (measured over the links' prediction);
every size's measurement and prediction are kept in ``fits`` for the record. Under NCCL
the buffers are device tensors and every timing waits for the device; under gloo they are
host tensors.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from typing import Any, Sequence

import torch
import torch.distributed as dist

from commgnn.dist.context import DistContext
from commgnn.netmodel.model import ClusterModel, Link, fit_link

PINGPONG_SIZES = (1_000, 10_000, 100_000, 1_000_000, 4_000_000)
A2A_SIZES = (10_000, 100_000, 1_000_000)


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


def _all_to_all(ctx: DistContext, sizes: Sequence[int]) -> list[float]:
    """Slowest rank's median seconds of one all-to-all with ``n`` bytes to every peer."""
    P, out, dev = ctx.world_size, [], ctx.comm_device
    for n in sizes:
        send = torch.zeros(n * P, dtype=torch.uint8, device=dev)
        recv = torch.empty_like(send)
        times = []
        for rep in range(_reps(n) + 1):
            ctx.barrier()
            t0 = time.perf_counter()
            dist.all_to_all_single(recv, send, group=ctx.group)
            _settle(dev)
            if rep:
                times.append(time.perf_counter() - t0)
        t = torch.tensor([statistics.median(times)], dtype=torch.float64)
        out.append(float(ctx.all_reduce(t, "max")[0]))
    return out


def calibrate(ctx: DistContext, ranks_per_host: int, *, sizes: Sequence[int] = PINGPONG_SIZES,
              a2a_sizes: Sequence[int] = A2A_SIZES) -> ClusterModel:
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
    fits["all_to_all"] = {"sizes": list(a2a_sizes), "measured_s": measured,
                          "predicted_s": [model.collective_s(B) for B in matrices],
                          "links_only_s": [links_only.collective_s(B) for B in matrices]}
    return model
