"""Short GPU benchmark (issue #15, section 5): the aggregation kernel against cuSPARSE, and
exact full-graph training against the best halo levers, on one machine's CUDA device.

(i) **SpMM**, ``out = A x`` with ``A: [N, N]`` CSR (E random entries) and ``x: [N, F]`` fp32,
    forward and forward + backward (``grad_x = A^T grad_out``), median of repeated runs:

    * ``commgnn spmm``: :func:`commgnn.models.graph.spmm` (its autograd function keeps
      ``A^T`` in CSR, built once);
    * ``torch.sparse.mm, A^T kept``: cuSPARSE through torch (``torch.sparse.mm`` without
      ``reduce``) for both products, the same work as commgnn's, done by hand;
    * ``torch.sparse.mm + autograd``: torch's own backward of the CSR product;
    * ``gather + index_add_``: the edge-wise message passing PyG's scatter path does.

    Effective traffic of one product: ``nnz F 4`` bytes of gathered rows plus the CSR arrays,
    ``nnz (8 + 4) + (N + 1) 8`` bytes (int64 column index and fp32 value per entry, int64
    row pointers); forward + backward counts two products. GB/s = that / the time.

(ii) **Full graph**: ``commgnn.train`` on a synthetic CSBM graph (GCN by default, 3 layers, hidden 64)
     with the exact exchange and the best levers of ``benchmarks/results/halo/*-halo-levers-*.md``
     (lossless = precompute + transform-first; tf + 4/8-bit; lossless + adaptive bits):
     halo bytes and the median epoch time. With one GPU the run has P = 1 (NCCL refuses two
     ranks on one GPU), so no halo rows travel; the levers' compute effects still show. A
     single-process PyG run on the same device and an exact run on the CPU give context.

Every measurement that fails is reported in its row (error type and first line) instead of
stopping the script. Writes ``gpu-bench-<date>.md`` and ``.json`` into ``--out`` (default:
``$OUT`` when set, which the device tool returns, else ``runs/gpu-bench``).

    python benchmarks/gpu_bench.py --device cuda                 # on the GPU machine
    python benchmarks/gpu_bench.py --device cpu --smoke          # tiny sizes: checks the script
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("COMMGNN_ENERGY", "0")  # no CodeCarbon start-up per run (nor its package)

import torch  # noqa: E402
from tables import cpu_model  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a checkout without installing it


def _err(exc: BaseException) -> str:
    line = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {line}"[:200]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device, warmup: int, reps: int) -> float:
    """Median seconds of ``fn`` (CUDA events on a GPU, wall clock on the CPU)."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ---------------------------------------------------------------- (i) SpMM
def triad_gbs(device: torch.device, n: int, warmup: int, reps: int) -> float:
    """STREAM triad ``a = b + s c`` on ``n``-element fp32 vectors, in GB/s counting 12 bytes
    per element (two reads, one write): the memory-bandwidth yardstick, measured in the same
    run as the kernels."""
    b = torch.rand(n, device=device)
    c = torch.rand(n, device=device)
    a = torch.empty_like(b)
    secs = timed(lambda: torch.add(b, c, alpha=3.0, out=a), device, warmup, reps)
    return 12 * n / secs / 1e9


def spmm_bench(device: torch.device, n: int, e: int, f: int, warmup: int, reps: int) -> dict[str, Any]:
    from commgnn.models.graph import CSRPair, spmm

    g = torch.Generator(device=device).manual_seed(0)
    src = torch.randint(0, n, (e,), device=device, generator=g)
    dst = torch.randint(0, n, (e,), device=device, generator=g)
    w = torch.rand(e, device=device, generator=g) + 0.1
    x = torch.randn(n, f, device=device, generator=g)
    grad = torch.randn(n, f, device=device, generator=g)
    t0 = time.perf_counter()
    pair = CSRPair.build(dst, src, w, (n, n))  # A[dst, src] = w, and A^T
    _sync(device)
    build_s = time.perf_counter() - t0
    a, at = pair.a, pair.at
    nnz = int(a.values().numel())
    one = nnz * f * 4 + nnz * (8 + 4) + (n + 1) * 8
    ref = torch.sparse.mm(a, x)
    xg = x.clone().requires_grad_()

    def backward(out: torch.Tensor) -> None:
        out.backward(grad)
        xg.grad = None

    variants: dict[str, tuple[Callable[[], Any], Callable[[], Any], Callable[[], torch.Tensor]]] = {}
    variants["commgnn spmm"] = (lambda: spmm(pair, x), lambda: backward(spmm(pair, xg)), lambda: spmm(pair, x))
    variants["torch.sparse.mm, A^T kept"] = (lambda: torch.sparse.mm(a, x),
                                             lambda: (torch.sparse.mm(a, x), torch.sparse.mm(at, grad)),
                                             lambda: torch.sparse.mm(a, x))
    variants["torch.sparse.mm + autograd"] = (lambda: torch.sparse.mm(a, x),
                                              lambda: backward(torch.sparse.mm(a, xg)),
                                              lambda: torch.sparse.mm(a, x))

    def gather_scatter(h: torch.Tensor) -> torch.Tensor:
        return h.new_zeros(n, f).index_add_(0, dst, h[src] * w[:, None])

    variants["gather + index_add_"] = (lambda: gather_scatter(x), lambda: backward(gather_scatter(xg)),
                                       lambda: gather_scatter(x))
    rows = []
    base = None
    for name, (fwd, fwd_bwd, value) in variants.items():
        row: dict[str, Any] = {"kernel": name}
        try:
            row["max_abs_diff"] = float((value() - ref).abs().max())
            row["fwd_ms"] = timed(fwd, device, warmup, reps) * 1e3
            row["fwd_bwd_ms"] = timed(fwd_bwd, device, warmup, reps) * 1e3
            row["fwd_gbs"] = one / (row["fwd_ms"] / 1e3) / 1e9
            row["fwd_bwd_gbs"] = 2 * one / (row["fwd_bwd_ms"] / 1e3) / 1e9
            if name == "torch.sparse.mm, A^T kept":
                base = row["fwd_bwd_ms"]
        except Exception as exc:  # e.g. a kernel that has no CUDA implementation
            row["error"] = _err(exc)
        rows.append(row)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    # vectors of 4 N F elements, four times x's size (410 MB each at the default shape; at least
    # 2^20), so that the triad streams from DRAM rather than cache
    triad_n = max(1 << 20, 4 * n * f)
    try:
        triad = triad_gbs(device, triad_n, warmup, reps)
    except Exception as exc:
        triad = None
        print(f"  triad failed: {_err(exc)}", flush=True)
    for row in rows:
        if base and "fwd_bwd_ms" in row:
            row["vs_cusparse"] = base / row["fwd_bwd_ms"]
        if triad and "fwd_bwd_gbs" in row:
            row["of_triad"] = row["fwd_bwd_gbs"] / triad
    return {"n": n, "e": e, "nnz": nnz, "f": f, "bytes_per_product": one, "build_s": build_s, "rows": rows,
            "triad_gbs": triad, "triad_n": triad_n}


# ---------------------------------------------------------------- (ii) full graph
SETTINGS: dict[str, dict[str, Any]] = {
    "exact": {},
    "lossless": {"precompute": True, "transform_first": True},
    "tf+q4f/8b": {"transform_first": True, "bits": {"forward": 4, "backward": 8}},
    "lossless+adaptive": {"precompute": True, "transform_first": True, "bits": "adaptive", "budget_mb": 0.2},
}


def pyg_epoch_s(data: Any, device: torch.device, epochs: int, model_name: str, layers: int, hidden: int) -> float:
    """Median epoch (a training step and an evaluation forward) of single-process PyG."""
    import torch.nn.functional as F

    from commgnn.models import ModelConfig, ReferenceGNN

    torch.manual_seed(0)
    model = ReferenceGNN(ModelConfig(name=model_name, layers=layers, hidden=hidden), data.x.shape[1],
                         data.num_classes_total).to(device)
    x, ei, y, mask = data.x.to(device), data.edge_index.to(device), data.y.to(device), data.train_mask.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    times = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        model.train()
        opt.zero_grad()
        F.cross_entropy(model(x, ei)[mask], y[mask]).backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            model(x, ei).argmax(1)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:] or times)


def fullgraph_bench(device: torch.device, nodes: int, epochs: int, parts: int, features: int,
                    cpu_baseline: bool, model: str = "gcn", avg_degree: float = 10.0, hidden: int = 64,
                    settings: list[str] | None = None, pyg: bool = True) -> dict[str, Any]:
    import commgnn
    from commgnn.runner.config import RunConfig
    from commgnn.comm.config import CommConfig, HaloConfig
    from commgnn.data import SyntheticConfig, make_csbm
    from commgnn.distributed.context import RuntimeConfig

    layers = 3
    t0 = time.perf_counter()
    data = make_csbm(SyntheticConfig(num_nodes=nodes, num_classes=10, feature_dim=features, avg_degree=avg_degree,
                                     homophily=0.7, seed=0))
    data.num_classes_total = 10
    gen_s = time.perf_counter() - t0
    work = Path(tempfile.mkdtemp(prefix="commgnn-gpu-bench-"))
    runs = [(name, device.type, parts, halo) for name, halo in SETTINGS.items() if not settings or name in settings]
    if cpu_baseline and device.type == "cuda":
        runs.append(("exact (CPU)", "cpu", 1, {}))
    rows = []
    for name, dev, P, halo in runs:
        row: dict[str, Any] = {"setting": name, "device": dev, "parts": P}
        try:
            runtime = RuntimeConfig(parts=P, device=dev, backend="nccl" if dev == "cuda" else "gloo",
                                    compute_alone=False)
            res = commgnn.train(data, model=model, parts=P, config=RunConfig(runtime=runtime),
                                comm=CommConfig(halo=HaloConfig(**halo)), epochs=epochs, patience=0,
                                layers=layers, hidden=hidden, quiet=True,
                                out=work / name.replace("/", "-").replace(" ", "_"))
            s = res.summary
            row.update(halo_mb=s["halo_bytes_per_epoch"] / 1e6, grad_mb=s["grad_bytes_per_epoch"] / 1e6,
                       epoch_ms=s["epoch_time_s"] * 1e3, test_acc=s["test_acc"],
                       compute_ms=s["time_split"]["compute"] * 1e3, comm_ms=s["time_split"]["comm"] * 1e3,
                       peak_rss_mb=s["peak_rss_mb"],
                       peak_device_mb=max(s["peak_device_mb_by_rank"]) if s.get("peak_device_mb_by_rank") else None)
        except Exception as exc:
            row["error"] = _err(exc)
            traceback.print_exc()
        rows.append(row)
        print(f"  full graph {name:18s} {dev} P={P}: " + (row.get("error") or
              f"epoch {row['epoch_ms']:.1f} ms, halo {row['halo_mb']:.3f} MB"), flush=True)
    try:
        if pyg:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            row = {"setting": "PyG, 1 process", "device": device.type, "parts": 1, "halo_mb": 0.0,
                   "epoch_ms": pyg_epoch_s(data, device, epochs, model, layers, hidden) * 1e3}
            if device.type == "cuda":
                row["peak_device_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
            rows.append(row)
    except Exception as exc:
        rows.append({"setting": "PyG, 1 process", "device": device.type, "parts": 1, "error": _err(exc)})
    shutil.rmtree(work, ignore_errors=True)
    exact = next((r for r in rows if r["setting"] == "exact" and "epoch_ms" in r), None)
    for r in rows:
        if exact and "epoch_ms" in r and r["device"] == exact["device"]:
            r["time_ratio"] = r["epoch_ms"] / exact["epoch_ms"]
            if exact["halo_mb"] and r["setting"] in SETTINGS and "halo_mb" in r:
                r["halo_reduction"] = exact["halo_mb"] / r["halo_mb"] if r["halo_mb"] else float("inf")
    return {"nodes": nodes, "edges": int(data.edge_index.shape[1]), "features": features, "model": model,
            "layers": layers,
            "hidden": hidden, "epochs": epochs, "parts": parts, "generate_s": gen_s, "rows": rows}


# ---------------------------------------------------------------- report
def device_info(device: torch.device) -> dict[str, str]:
    info = {"torch": torch.__version__, "python": platform.python_version(), "host": platform.node()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(device=f"{props.name} ({props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} SMs)",
                    cuda=str(torch.version.cuda), gpus=str(torch.cuda.device_count()))
        try:
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            pass
        try:
            info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                            capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
        except Exception:
            pass
    else:
        info["device"] = f"{cpu_model(platform.processor() or 'CPU')}, {len(os.sched_getaffinity(0))} cores"
    try:
        info["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True,
                                        text=True, timeout=10).stdout.strip() or "unknown"
    except Exception:
        info["commit"] = "unknown"
    return info


def _f(v: Any, fmt: str) -> str:
    return "—" if v is None else format(v, fmt)


def markdown(info: dict[str, str], kern: dict[str, Any] | None, fulls: list[dict[str, Any]], today: str,
             smoke: bool) -> str:
    def table(columns: tuple[str, ...], lead: tuple[str, ...], rows: list[dict[str, Any]],
              row: Callable[[dict[str, Any]], str]) -> list[str]:
        """A Markdown table, ``row(r)`` a line; a failed row shows its ``lead`` keys and its error."""
        out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        for r in rows:
            out.append(row(r) if "error" not in r else "| " + " | ".join(str(r[k]) for k in lead)
                       + f" | failed: {r['error']} |" + " |" * (len(columns) - len(lead) - 1))
        return out

    def kernel_row(r: dict[str, Any]) -> str:
        return (f"| {r['kernel']} | {r['fwd_ms']:.3f} | {r['fwd_gbs']:.0f} | {r['fwd_bwd_ms']:.3f} | "
                f"{r['fwd_bwd_gbs']:.0f} | {_f(r.get('of_triad'), '.0%')} | {_f(r.get('vs_cusparse'), '.2f')}x | "
                f"{r['max_abs_diff']:.2e} |")

    def full_row(r: dict[str, Any]) -> str:
        red = r.get("halo_reduction")
        return (f"| {r['setting']} | {r['device']} | {r['parts']} | {_f(r.get('halo_mb'), '.3f')} | "
                f"{_f(red, '.1f') + 'x' if red is not None else '—'} | {r['epoch_ms']:.1f} | "
                f"{_f(r.get('time_ratio'), '.2f')} | {_f(r.get('compute_ms'), '.1f')} | "
                f"{_f(r.get('comm_ms'), '.1f')} | {_f(r.get('peak_device_mb'), ',.0f')} | "
                f"{_f(r.get('test_acc'), '.4f')} |")

    lines = [f"# GPU benchmark ({today}){' — smoke run, tiny sizes' if smoke else ''}", "",
             f"Device: **{info['device']}**. " + ", ".join(f"{k} {v}" for k, v in info.items()
                                                         if k not in ("device",)) + ".",
             f"`python benchmarks/gpu_bench.py {' '.join(sys.argv[1:])}`", ""]
    if kern is not None:
        lines += [f"## SpMM: N = {kern['n']:,}, E = {kern['e']:,} (nnz {kern['nnz']:,} after merging repeats), "
                  f"F = {kern['f']}, fp32", "",
                  f"Effective traffic of one product: nnz·F·4 + nnz·12 + (N+1)·8 = "
                  f"{kern['bytes_per_product'] / 1e9:.3f} GB (forward + backward: twice). CSR build (A and A^T): "
                  f"{kern['build_s']:.2f} s. Median of the timed runs. STREAM triad (a = b + 3c, "
                  f"{kern.get('triad_n', 0):,} fp32 elements, 12 bytes each) in the same run: "
                  f"{_f(kern.get('triad_gbs'), ',.0f')} GB/s. Effective GB/s can pass it where gathered "
                  f"rows hit in cache.", "",
                  *table(("kernel", "fwd ms", "fwd GB/s", "fwd+bwd ms", "fwd+bwd GB/s", "fwd+bwd / triad",
                          "speed vs cuSPARSE (A^T kept), fwd+bwd", "max abs diff vs torch.sparse.mm"),
                         ("kernel",), kern["rows"], kernel_row), ""]
    for full in fulls:
        lines += [f"## Full graph: CSBM, {full['nodes']:,} nodes, {full['edges']:,} directed edges, "
                  f"{full['features']} features; {full['model'].upper()}, {full['layers']} layers, "
                  f"hidden {full['hidden']}; "
                  f"{full['epochs']} epochs, P = {full['parts']}", "",
                  "Epoch = one training step and one exact evaluation forward (median). "
                  + ("With P = 1 no halo rows travel (one GPU: NCCL refuses two ranks on it); "
                     "precompute and transform-first still change the compute. " if full["parts"] == 1 else "")
                  + "Halo MB per epoch is summed over ranks.", "",
                  *table(("setting", "device", "P", "halo MB/epoch", "halo reduction", "epoch ms", "time vs exact",
                          "compute ms (busiest rank, mean)", "comm ms", "peak GPU MB (max rank)", "test acc"),
                         ("setting", "device", "parts"), full["rows"], full_row), ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, few repeats: checks the script, not a result")
    ap.add_argument("--out", default=os.environ.get("OUT") or "runs/gpu-bench")
    ap.add_argument("--nodes", type=int, help="SpMM N (default 200,000; smoke 3,000)")
    ap.add_argument("--edges", type=int, help="SpMM E (default 4,000,000; smoke 30,000)")
    ap.add_argument("--features", type=int, help="SpMM F (default 128; smoke 16)")
    ap.add_argument("--graph-nodes", type=int, help="full-graph CSBM nodes (default 100,000; smoke 400)")
    ap.add_argument("--epochs", type=int, help="full-graph epochs (default 10; smoke 3)")
    ap.add_argument("--parts", type=int, default=0,
                    help="full-graph ranks; 0 = the GPUs (up to 4) when there are two or more, else 1 (CPU: 2)")
    ap.add_argument("--models", nargs="+", choices=("gcn", "sage", "gat"), default=["gcn"],
                    help="full-graph models, one table each (default gcn; the CPU baseline runs for the first)")
    ap.add_argument("--skip", choices=("spmm", "fullgraph"), action="append", default=[])
    ap.add_argument("--no-cpu-baseline", action="store_true", help="skip the exact run on the CPU")
    ap.add_argument("--no-pyg", action="store_true", help="skip the single-process PyG row")
    ap.add_argument("--avg-degree", type=float, default=10.0, help="full-graph CSBM average degree (default 10)")
    ap.add_argument("--hidden", type=int, default=64, help="full-graph hidden width (default 64)")
    ap.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=None,
                    help="full-graph settings (default: all)")
    ap.add_argument("--tag", default="", help="appended to the report's file name (gpu-bench-<date>-<tag>)")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: torch.cuda.is_available() is False")
    s = args.smoke
    n = args.nodes or (3_000 if s else 200_000)
    e = args.edges or (30_000 if s else 4_000_000)
    f = args.features or (16 if s else 128)
    graph_nodes = args.graph_nodes or (400 if s else 100_000)
    epochs = args.epochs or (3 if s else 10)
    parts = args.parts or ((min(torch.cuda.device_count(), 4) if torch.cuda.device_count() >= 2 else 1)
                           if device.type == "cuda" else 2)
    info = device_info(device)
    print(f"gpu_bench: {info}", flush=True)
    today = dt.date.today().isoformat()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"gpu-bench-{today}{'-smoke' if s else ''}{'-' + args.tag if args.tag else ''}"
    kern: dict[str, Any] | None = None
    fulls: list[dict[str, Any]] = []

    def write() -> str:
        """The report so far (rewritten after each part: a run cut short keeps what it measured)."""
        md = markdown(info, kern, fulls, today, s)
        (out / f"{stem}.md").write_text(md)
        (out / f"{stem}.json").write_text(json.dumps({"date": today, "info": info, "args": vars(args),
                                                      "spmm": kern, "fullgraph": fulls}, indent=1))
        return md

    if "spmm" not in args.skip:
        print(f"SpMM N={n} E={e} F={f} on {device}", flush=True)
        kern = spmm_bench(device, n, e, f, warmup=1 if s else 3, reps=3 if s else 20)
        for r in kern["rows"]:
            print("  " + json.dumps(r), flush=True)
        write()
    if "fullgraph" not in args.skip:
        for i, model in enumerate(args.models):
            print(f"full graph: {model}, {graph_nodes} nodes, {epochs} epochs, P={parts} on {device}", flush=True)
            fulls.append(fullgraph_bench(device, graph_nodes, epochs, parts, 16 if s else 128,
                                         cpu_baseline=i == 0 and not args.no_cpu_baseline, model=model,
                                         avg_degree=args.avg_degree, hidden=args.hidden, settings=args.settings,
                                         pyg=not args.no_pyg))
            write()
    print(write())
    print(f"wrote {out / stem}.md and .json", flush=True)


if __name__ == "__main__":
    main()
