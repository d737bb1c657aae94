"""Remote-row cache sweep for distributed mini-batch training: hit rate against the
offline optimum, and feature bytes, per policy, size and fetch codec.

What a cache serves depends only on the sampler's requests, not on the model's numbers,
so this sweep runs the mini-batch trainer's own input pipeline (sampler, fetcher, cache,
exactly as training runs it) for ``--epochs`` epochs per setting without the forward and
backward passes. Settings: no cache, and ``degree`` (PaGraph), ``presample`` (GNNLab, one
pre-sampled epoch) and ``lru`` caches of 5%, 10% and 25% of each rank's remote rows
(the other ranks' nodes within 2 hops of its training nodes), each with fp32 and with 4-bit
rows, and no cache at either width. GraphSAGE neighbour sampling,
fan-out 15,10, batch 512, 4 ranks, METIS (the partition ``benchmarks/minibatch.py``
saves), seed 0.

Columns: hit rate over all ranks' remote requests; the best static cache of the same size
in hindsight on the same request trace (``optimal``, GNNLab's yardstick) and Belady's
step-level optimum for a dynamic cache; their ratio; feature bytes per epoch (ids and
rows, all ranks) and the reduction against the uncached fp32 fetch.

    python benchmarks/minibatch_cache.py --datasets CS Computers Physics
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path
from typing import Any

import torch

from commgnn.distributed.context import LaunchInfo, RuntimeConfig, free_port, init_distributed, shutdown
from commgnn.distributed.events import CommEvent, Hooks
from commgnn.distributed.spawn import spawn_ranks
from commgnn.fetch.config import FetchConfig
from commgnn.models import ModelConfig
from commgnn.partition import load_partition
from commgnn.sampling.config import SamplerConfig
from commgnn.trainers import TrainConfig
from commgnn.trainers.minibatch import MiniBatchTrainer
from tables import write_table

SETTINGS: list[tuple[str, dict[str, Any]]] = [("none fp32", {})]
for _policy in ("degree", "presample", "lru"):
    for _ratio in (0.05, 0.10, 0.25):
        SETTINGS.append((f"{_policy} {_ratio:.0%} fp32", {"cache_ratio": _ratio, "cache_policy": _policy}))
SETTINGS += [("none 4-bit", {"bits": 4})]
SETTINGS += [(f"{p} {r:.0%} 4-bit", {"cache_ratio": r, "cache_policy": p, "bits": 4})
             for p in ("degree", "presample", "lru") for r in (0.05, 0.10, 0.25)]


def _rank(info: LaunchInfo, part_dir: str, epochs: int, out: str) -> None:
    ctx = init_distributed(info, RuntimeConfig(parts=info.world_size, timeout_s=600, threads=1))
    part = load_partition(part_dir, ctx.rank, expected_parts=ctx.world_size)
    results = []
    for name, fetch in SETTINGS:
        hooks, sent = Hooks(), {"feature": 0}

        def count(ev: Any) -> None:
            if isinstance(ev, CommEvent) and ev.kind in ("fetch_ids", "fetch_rows"):
                sent["feature"] += ev.nbytes

        t = MiniBatchTrainer(ctx, part, ModelConfig(name="sage", hidden=64), TrainConfig(seed=0), hooks,
                             sampler_cfg=SamplerConfig(sampler="neighbor", fanout=(15, 10), batch_size=512),
                             fetch_cfg=FetchConfig(**fetch))
        hooks.subscribe(count)
        logs = []
        for _ in range(epochs):
            for _batch in t._batches():
                pass
            logs.append(t.epoch_log())
        total = torch.tensor([float(sent["feature"])], dtype=torch.float64)
        ctx.all_reduce(total)
        results.append({"setting": name, "logs": logs, "feature_bytes": float(total[0]) / epochs,
                        "capacity": t.capacity})
    if ctx.is_main:
        torch.save(results, out)
    shutdown(ctx)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--datasets", nargs="+", default=["CS", "Computers", "Physics"])
    ap.add_argument("--bench-out", default="runs/bench-minibatch", help="where benchmarks/minibatch.py keeps partitions")
    ap.add_argument("--epochs", type=int, default=2)
    ns = ap.parse_args()
    rows = []
    for ds in ns.datasets:
        part_dir = Path(ns.bench_out) / ds / "parts4"
        out = Path(ns.bench_out) / ds / "cache-sweep.pt"
        if not out.is_file():
            spawn_ranks(_rank, (str(part_dir), ns.epochs, str(out)), nprocs=4, master_addr="127.0.0.1",
                        port=free_port())
        results = torch.load(out, weights_only=False)
        base = results[0]["feature_bytes"]
        for r in results:
            logs = r["logs"]
            req = sum(x["remote_requests"] for x in logs)
            hits = sum(x["cache_hits"] for x in logs)
            opt = sum(x.get("cache_hit_rate_optimal", 0.0) * x["remote_requests"] for x in logs)
            bel = sum(x.get("cache_hit_rate_belady", 0.0) * x["remote_requests"] for x in logs)
            rate, orate, brate = hits / max(req, 1), opt / max(req, 1), bel / max(req, 1)
            rows.append({"dataset": ds, "setting": r["setting"], "cache_rows_rank0": r["capacity"],
                         "remote_requests_per_epoch": req // len(logs),
                         "hit_rate_%": f"{100 * rate:.1f}", "optimal_static_%": f"{100 * orate:.1f}",
                         "of_optimal_%": f"{100 * rate / orate:.0f}" if orate else "—",
                         "belady_%": f"{100 * brate:.1f}",
                         "feature_MB_per_epoch": f"{r['feature_bytes'] / 1e6:.1f}",
                         "reduction_x": f"{base / max(r['feature_bytes'], 1):.2f}"})
    stem = Path(__file__).resolve().parent / "results" / "minibatch" / f"{datetime.date.today()}-minibatch-cache"
    write_table(rows, stem, f"Remote-row cache sweep ({datetime.date.today()})",
                [f"4 gloo ranks; {ns.epochs} epochs per setting (protocol in `benchmarks/minibatch_cache.py`)."])
    print(stem.with_suffix(".md").read_text())

if __name__ == "__main__":
    main()
