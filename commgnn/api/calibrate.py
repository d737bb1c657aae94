"""``commgnn.calibrate`` (``commgnn calibrate``): measure the cluster's links and write
their alpha-beta model.

    commgnn calibrate --parts 4 --out net.json                     # local ranks, one host
    commgnn cluster --hosts 4 --ranks-per-host 2 --rate 100mbit -- calibrate --out net.json
    torchrun --nnodes 2 --nproc-per-node 4 ... -m commgnn calibrate --out net.json

Under torchrun a host is a torchrun node (``LOCAL_WORLD_SIZE`` ranks); rank 0 writes the
model (:class:`commgnn.netmodel.ClusterModel` as JSON).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any, Mapping

from commgnn.errors import UserError
from commgnn.netmodel.config import CalibrateConfig
from commgnn.options import OptionSet, opt


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = sorted({int(float(x)) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"sizes are byte counts separated by commas, got {text!r}") from None
    if len(sizes) < 2 or sizes[0] < 1:
        raise argparse.ArgumentTypeError("give at least two positive sizes")
    return tuple(sizes)


CALIBRATE_OPTIONS = OptionSet("calibrate", lambda: CalibrateConfig, (
    opt("out", "--out", "JSON file to write the fitted model to (required)"),
    opt("parts", "--parts", "local ranks when not under torchrun"),
    opt("timeout_s", "--timeout", "collective time-out, s"),
    opt("sizes", "--sizes", "ping-pong message sizes in bytes, comma-separated (default: "
        "1000,10000,100000,1000000,4000000)", parse=_sizes),
))
"""The options of ``commgnn calibrate`` (:class:`CalibrateConfig`)."""


def _rank(info: Any, out: str, timeout_s: float, sizes: tuple[int, ...]) -> None:
    from commgnn.distributed.config import RuntimeConfig
    from commgnn.distributed.context import init_distributed, shutdown
    from commgnn.netmodel.calibrate import calibrate

    ctx = init_distributed(info, RuntimeConfig(parts=info.world_size, timeout_s=timeout_s, threads=1))
    given = {"sizes": list(sizes), "a2a_sizes": list(sizes[-2:]),
             "ar_sizes": sorted({4_000, *sizes[-2:]})} if sizes else {}
    model = calibrate(ctx, info.local_world_size, **given)
    if ctx.is_main:
        tmp = Path(out).with_suffix(".tmp")
        tmp.write_text(json.dumps(model.to_dict(), indent=1) + "\n")
        tmp.replace(out)
    shutdown(ctx)


def describe(d: dict[str, Any]) -> str:
    lines = [f"{d['hosts']} hosts x {d['ranks_per_host']} ranks ({d['source']})"]
    for name in ("intra", "inter"):
        link = d[name]
        rate = 8.0 / link["beta_s"] if link["beta_s"] > 0 else float("inf")
        lines.append(f"  {name}: alpha {link['alpha_s'] * 1e6:.1f} us, {rate / 1e6:.1f} Mbit/s")
    a2a = d.get("fits", {}).get("all_to_all")
    if a2a:
        for n, m, p in zip(a2a["sizes"], a2a["measured_s"], a2a["predicted_s"]):
            lines.append(f"  all-to-all {n / 1e3:g} kB/peer: measured {m * 1e3:.2f} ms, model {p * 1e3:.2f} ms")
    ar = d.get("fits", {}).get("all_reduce")
    if ar:
        for n, m, r in zip(ar["sizes"], ar["measured_s"], ar["ring_s"]):
            lines.append(f"  all-reduce {n / 1e3:g} kB: measured {m * 1e3:.2f} ms, ring over the links {r * 1e3:.2f} ms")
    if d.get("scalar_allreduce_s") is not None:
        lines.append(f"  all-reduce of 4 scalars: {d['scalar_allreduce_s'] * 1e3:.2f} ms")
    if d.get("barrier_s") is not None:
        lines.append(f"  barrier: {d['barrier_s'] * 1e3:.2f} ms")
    return "\n".join(lines)


def calibrate(out: str | Path | None = None, *, config: CalibrateConfig | str | Path | None = None,
              env: Mapping[str, str] | None = None, **options: Any) -> dict[str, Any]:
    """Measure the links between the ranks (ping-pong, all-to-all, all-reduce) and write
    their fitted model to ``out``; the model as a dict on rank 0 (the others get ``{}``).

    Local ranks (``parts=``, default 2) are spawned, unless under ``torchrun``, where every
    rank calls this and a host is a torchrun node. Options by keyword: ``parts``,
    ``timeout_s``, ``sizes`` (:data:`CALIBRATE_OPTIONS`)."""
    from commgnn.distributed.context import free_port, launch_info_from_env
    from commgnn.distributed.spawn import spawn_ranks

    env = os.environ if env is None else env
    if out is not None:
        options["out"] = str(out)
    CALIBRATE_OPTIONS.unknown(list(options), "calibrate's")
    if isinstance(config, CalibrateConfig):
        cfg = CALIBRATE_OPTIONS.resolve(None, options, env, start=config)
    else:
        cfg = CALIBRATE_OPTIONS.resolve(str(config) if config else None, options, env)
    if not cfg.out:
        raise UserError("calibrate needs out= (--out), the JSON file to write")
    path = Path(cfg.out)
    if not path.parent.is_dir():
        raise UserError(f"--out {path}: folder {path.parent} does not exist")
    info = launch_info_from_env(env)
    if info is not None:
        if info.world_size < 2:
            raise UserError("calibration needs at least 2 ranks")
        _rank(info, str(path), cfg.timeout_s, cfg.sizes)
        if info.rank != 0:
            return {}
    else:
        if cfg.parts < 2:
            raise UserError("--parts must be at least 2 (a link needs two ends)")
        spawn_ranks(_rank, (str(path), cfg.timeout_s, cfg.sizes), nprocs=cfg.parts, master_addr="127.0.0.1",
                    port=free_port())
    return json.loads(path.read_text())  # type: ignore[no-any-return]
