"""Large graphs from disk, every step inside a memory cgroup capped at 20 GB (issue 55).

Each step is one ``commgnn`` command run by :func:`commgnn.metrics.memcap.run_capped`: the
command and every process it starts (launcher, fork server, ranks) sit in a fresh memory
cgroup whose hard cap counts anonymous memory and page cache; every 0.5 s the PSS of each
of its processes is read from ``/proc/<pid>/smaps_rollup``. A row reports the wall time,
the peak of the summed PSS (and its anonymous and file-backed parts), the cgroup's own
peak (page cache included), the largest single process, and whether the kernel OOM-killed
anything.

Target 1 (``--target products``): a products-sized synthetic graph (2,449,029 nodes,
123,718,280 directed edges, 100 features, 47 classes, 8% training nodes) is generated,
checked, partitioned into 4 parts (lp-metis out of core, against random: METIS does not fit
here), then trained full-graph with exact GCN 3 x 128 and GraphSAGE 3 x 128, and with
transform-first + 4-bit halos, for ``--epochs`` epochs on 4 ranks.

Target 3 (``--target papers``): a papers100M-shaped graph (100M nodes, 1B directed edges,
128 float16 features) generated and checked, partitioned by lp-metis out of core with the
features left in the graph's ``x.npy`` (with the disk's peak, scratch included), then one
epoch of mini-batch GraphSAGE (15,10, batch 1024) with sampled evaluation (``--train-only``
reuses the graph and the partition directory).

For training rows the *floor* is the bytes that must be resident, summed over ranks
(:func:`floor_bytes`): owned and halo feature rows, one int32 CSR per direction, what
backward needs of each layer (its aggregated input and the masks), the largest halo block
in flight, the logits, and the weights with Adam's state. ``measured / floor`` divides the peak summed PSS by it.

    python benchmarks/large_graphs.py --target products --work /tmp/big
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from tables import write_table

from commgnn.metrics.memcap import run_capped

RESULTS = Path(__file__).resolve().parent / "results" / "large"
GB = 1 << 30

PRODUCTS = {"nodes": 2_449_029, "edges": 123_718_280, "features": 100, "classes": 47, "train_fraction": 0.08}
BIG10M = {"nodes": 10_000_000, "edges": 200_000_000, "features": 128, "classes": 47, "x_dtype": "float16"}
PAPERS = {"nodes": 100_000_000, "edges": 1_000_000_000, "features": 128, "classes": 172,
          "train_fraction": 0.01, "valid_fraction": 0.001, "test_fraction": 0.002, "x_dtype": "float16"}
SETTINGS = {"exact": [], "tf-4bit": ["--transform-first", "--bits", "4"],
            "exact-ckpt": ["--checkpoint-activations"],
            "tf-4bit-ckpt": ["--transform-first", "--bits", "4", "--checkpoint-activations"]}


def commgnn(args: list[str], cap_gb: float, log: Path) -> dict[str, Any]:
    """Run ``commgnn ARGS`` under the cap; its measurements as a row."""
    with log.open("w") as fh:
        res = run_capped([sys.executable, "-m", "commgnn", *args], int(cap_gb * GB), stdout=fh, stderr=fh)
    row: dict[str, Any] = dict(res.row())
    row["largest_process_gb"] = round(max(res.per_process_peak.values(), default=0) / GB, 3)
    if res.returncode != 0:
        tail = log.read_text().strip().splitlines()[-1:] if log.exists() else []
        row["error"] = tail[0][:200] if tail else f"exit {res.returncode}"
    return row


def floor_bytes(meta: dict[str, Any], *, layers: int, hidden: int, model: str) -> int:
    """The resident floor of exact full-graph training, summed over ranks (module docstring).

    Per rank, with ``n_own`` owned rows, ``n_halo`` halo rows and ``e`` local edges: the
    owned and halo feature rows ``(n_own + n_halo) F`` float32; one CSR per direction over
    the ``e + n_own`` entries with self loops (int32 index, float32 value, int64 row
    pointers); what backward needs of each layer, the aggregated input ``[n_own, d_in]``
    float32 and one bit per hidden output for the ReLU and dropout masks; the largest
    hidden halo block in flight, ``n_halo H`` float32 (layer 0's is the features, counted
    above); the logits; and, once, the weights with their gradients and Adam's two moments.
    GraphSAGE keeps the owned rows of each layer input as well (its root weight)."""
    rep = meta["report"]
    F, C = int(meta["num_features"]), int(meta["num_classes"])
    dims = [F] + [hidden] * (layers - 1)
    total = 0
    for n_own, n_halo, e in zip(rep["nodes"], rep["halo_in"], rep["edges"]):
        total += (n_own + n_halo) * F * 4
        total += 2 * ((e + n_own) * 8) + (n_own + 1) * 8 + (n_own + n_halo + 1) * 8
        total += sum(n_own * d * 4 * (2 if model == "sage" else 1) for d in dims) + layers * n_own * hidden // 4
        total += (n_halo * hidden * 4 if layers > 1 else 0) + n_own * C * 4
    params = (F * hidden + (layers - 2) * hidden * hidden + hidden * C) * (2 if model == "sage" else 1)
    return total + 4 * 4 * params


def append(path: Path, row: dict[str, Any]) -> None:
    """One measured row, appended to the JSON-lines record (rows differ in their keys)."""
    with path.open("a") as fh:
        fh.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


def generate(ns: argparse.Namespace, graph: Path, params: dict[str, Any], logs: Path, record: Path) -> None:
    """``commgnn datasets synth`` with ``params`` into ``graph`` under the cap (unless it is
    there and ``--regenerate`` is not given); its row, with the folder's size on disk."""
    logs.mkdir(parents=True, exist_ok=True)
    if (graph / "meta.json").exists() and not ns.regenerate:
        return
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in params.items()]
    row = commgnn(["datasets", "synth", *flags, "--out", str(graph), "--quiet"], ns.cap_gb,
                  logs / f"synth-{graph.name}.log")
    row["disk_gb"] = round(sum(f.stat().st_size for f in graph.rglob("*") if f.is_file()) / GB, 2)
    append(record, {"step": "generate", "setting": "", **row})


def predict_and_report(ns: argparse.Namespace, run: Path, logs: Path, record: Path) -> None:
    """Target 4 on a run folder: ``commgnn predict RUN`` under the cap, its scores checked
    against the run's own ``predictions.pt``, then ``commgnn report RUN``; a row each."""
    import torch

    scores = run.parent / f"scores-{run.name}.pt"
    row = commgnn(["predict", str(run), "--out", str(scores)], ns.cap_gb, logs / f"predict-{run.name}.log")
    if scores.exists() and "error" not in row:
        mine, trained = torch.load(scores), torch.load(run / "predictions.pt")
        row["max_abs_diff_vs_run_predictions"] = float((mine - trained).abs().max())
        del mine, trained
        scores.unlink()
    append(record, {"step": "predict", "setting": run.name, **row})
    report_row(ns, run, logs, record)


def report_row(ns: argparse.Namespace, run: Path, logs: Path, record: Path) -> None:
    """``commgnn report RUN`` under the cap (target 4); its row, with the page's size."""
    page = run.parent / f"report-{run.name}.html"
    row = commgnn(["report", str(run), "--out", str(page)], ns.cap_gb, logs / f"report-{run.name}.log")
    if page.exists():
        row["page_kb"] = round(page.stat().st_size / 1e3)
        page.unlink()
    append(record, {"step": "report", "setting": run.name, **row})


def check(ns: argparse.Namespace, graph: Path, log: Path, record: Path) -> None:
    """``commgnn datasets check`` (streamed validation and hashes) under the cap; its row."""
    row = commgnn(["datasets", "check", str(graph)], ns.cap_gb, log)
    append(record, {"step": "check", "setting": "", **row})


def products(ns: argparse.Namespace, work: Path, csv_path: Path) -> None:
    graph = work / "products"
    logs = work / "logs"
    generate(ns, graph, PRODUCTS, logs, csv_path)
    if not ns.train_only:
        check(ns, graph, logs / "check.log", csv_path)
    for method in ([] if ns.train_only else ns.partitioners):
        pdir = work / f"parts-{method}"
        row = commgnn(["partition", "--dataset", str(graph), "--parts", "4", "--partitioner", method,
                       "--out", str(pdir)], ns.cap_gb, logs / f"partition-{method}.log")
        if (pdir / "meta.json").exists() and "error" not in row:
            pmeta = json.loads((pdir / "meta.json").read_text())
            rep = pmeta["report"]
            row["edge_cut_pairs"] = rep["edge_cut"]
            row["cut_fraction"] = round(rep["cut_edges_directed"] / pmeta["num_edges"], 4)
            row["halo_rows"] = sum(rep["halo_in"])
        append(csv_path, {"step": f"partition {method}", "setting": "", **row})
    pdir = work / f"parts-{ns.partitioners[0]}"
    meta = json.loads((pdir / "meta.json").read_text())
    if ns.predict_only:  # target 4 on the runs already in --work
        for run in sorted(work.glob("run-*-exact")):
            if (run / "predictions.pt").exists():
                predict_and_report(ns, run, logs, csv_path)
        return
    for model in ns.models:
        for setting in ns.settings:
            out = work / f"run-{model}-{setting}"
            shutil.rmtree(out, ignore_errors=True)  # a rerun measures afresh
            args = ["train", "--dataset", str(graph), "--partition-dir", str(pdir), "--parts", "4",
                    "--model", model, "--layers", "3", "--hidden", "128", "--epochs", str(ns.epochs),
                    "--patience", "0", "--no-energy", "--no-compute-alone", "--timeout", "900", "--quiet",
                    "--out", str(out),
                    "--memory-limit-gb", str(ns.preflight_gb or ns.cap_gb), *SETTINGS[setting]]
            row = commgnn(args, ns.cap_gb, logs / f"train-{model}-{setting}.log")
            floor = floor_bytes(meta, layers=3, hidden=128, model=model)
            row["floor_gb"] = round(floor / GB, 3)
            row["measured_over_floor"] = round(row["peak_pss_gb"] * GB / floor, 2)
            if (out / "summary.json").exists():
                s = json.loads((out / "summary.json").read_text())
                row["epoch_s"] = round(s["epoch_time_s"], 2)
                row["halo_mb_per_epoch"] = round(s["halo_bytes_per_epoch"] / 1e6, 1)
                row["rank_peak_gb"] = round(s["peak_rss_mb"] / 1024, 2)
                row["test_acc"] = round(s["test_acc"], 4)
            append(csv_path, {"step": f"train {model}", "setting": setting, **row})


def big10m(ns: argparse.Namespace, work: Path, record: Path) -> None:
    """Target 2: 10M nodes / 200M directed edges / 128 float16 features, mini-batch
    GraphSAGE (15,10, batch 1024) on 4 ranks for one epoch and its evaluation, from 4
    partitions made once by ``commgnn partition`` (METIS does not fit: lp-metis out of core),
    then ``commgnn predict`` on the run (target 4), its scores checked against the run's own
    ``predictions.pt``."""
    graph = work / "big10m"
    logs = work / "logs"
    generate(ns, graph, BIG10M, logs, record)
    pdir = work / "parts10m"
    if not (pdir / "meta.json").exists():
        row = commgnn(["partition", "--dataset", str(graph), "--parts", "4", "--partitioner", "lp-metis",
                       "--out", str(pdir)], ns.cap_gb, logs / "partition10m.log")
        append(record, {"step": "partition lp-metis", "setting": "", **row})
    out = work / "run-10m-sage-minibatch"
    if not ns.predict_only:
        train10m(ns, graph, pdir, out, logs, record)
    scores = work / "scores10m.pt"
    row = commgnn(["predict", str(out), "--out", str(scores)], ns.cap_gb, logs / "predict10m.log")
    if scores.exists() and "error" not in row:
        import torch
        mine, trained = torch.load(scores), torch.load(out / "predictions.pt")
        row["max_abs_diff_vs_run_predictions"] = float((mine - trained).abs().max())
        del mine, trained
        scores.unlink()
    append(record, {"step": "predict (layer-wise)", "setting": "", **row})
    report_row(ns, out, logs, record)


def train10m(ns: argparse.Namespace, graph: Path, pdir: Path, out: Path, logs: Path, record: Path) -> None:
    """The mini-batch epoch of target 2, from the partition directory ``pdir``."""
    shutil.rmtree(out, ignore_errors=True)
    args = ["train", "--dataset", str(graph), "--partition-dir", str(pdir), "--parts", "4", "--mode", "minibatch",
            "--model", "sage",
            "--layers", "2", "--hidden", "128", "--sampler", "neighbor", "--fanout", "15,10", "--batch-size", "1024",
            "--epochs", "1", "--patience", "0", "--no-energy", "--timeout", "900", "--quiet", "--out", str(out),
            "--memory-limit-gb", str(ns.preflight_gb or ns.cap_gb)]
    row = commgnn(args, ns.cap_gb, logs / "train-10m.log")
    if (out / "summary.json").exists():
        s = json.loads((out / "summary.json").read_text())
        m = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
        row["epoch_s"] = round(s["epoch_time_s"], 1)
        row["train_loop_s"] = round(m["train_loop_s"], 1)
        row["steps_per_rank"] = m["steps"]
        row["sampled_edges_per_s"] = round(m["sampled_edges_per_step"] * m["steps"] * 4 / m["train_loop_s"])
        row["rank_peak_gb"] = round(s["peak_rss_mb"] / 1024, 2)
        row["test_acc"] = round(s["test_acc"], 4)
        row["method"] = json.loads((pdir / "meta.json").read_text())["method"]
        row["inference"] = m.get("inference", "")
    append(record, {"step": "train sage minibatch", "setting": "15,10 b1024", **row})


class DiskPeak:
    """The peak of the filesystem's used bytes under ``path`` while the block runs, sampled
    every 2 s in a thread (scratch files included, which are gone when the step ends)."""

    def __init__(self, path: Path) -> None:
        self.path, self.peak, self._stop = path, 0, False

    def __enter__(self) -> "DiskPeak":
        import threading
        self.base = shutil.disk_usage(self.path).used
        self.peak = self.base
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        import time
        while not self._stop:
            self.peak = max(self.peak, shutil.disk_usage(self.path).used)
            time.sleep(2.0)

    def __exit__(self, *_: Any) -> None:
        self._stop = True
        self._thread.join()
        self.peak = max(self.peak, shutil.disk_usage(self.path).used)

    @property
    def added_gb(self) -> float:
        return round((self.peak - self.base) / GB, 2)


def du_gb(path: Path) -> float:
    return round(sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / GB, 2)


def papers(ns: argparse.Namespace, work: Path, record: Path) -> None:
    """Target 3: a papers100M-shaped graph (100M nodes, 1B directed edges, 128 float16
    features, 172 classes, 1% training nodes) generated to disk and checked, then
    partitioned into 4 parts out of core by ``commgnn partition --partitioner lp-metis
    --partition-features source`` (the rank folders read their feature rows from the
    graph's ``x.npy``: no copy), with the disk it takes at its peak (scratch included)."""
    graph = work / "papers"
    logs = work / "logs"
    generate(ns, graph, PAPERS, logs, record)
    if not ns.train_only:
        check(ns, graph, logs / "check-papers.log", record)
    pdir = work / "parts-papers"
    if not (pdir / "meta.json").exists():
        with DiskPeak(work) as disk:
            row = commgnn(["partition", "--dataset", str(graph), "--parts", "4", "--partitioner", "lp-metis",
                           "--partition-features", "source", "--out", str(pdir)], ns.cap_gb,
                          logs / "partition-papers.log")
        row["graph_disk_gb"] = du_gb(graph)
        row["disk_added_peak_gb"] = disk.added_gb
        if (pdir / "meta.json").exists():
            rep = json.loads((pdir / "meta.json").read_text())["report"]
            row["partition_disk_gb"] = du_gb(pdir)
            row["disk_peak_total_gb"] = round(row["graph_disk_gb"] + disk.added_gb, 2)
            row["cut_directed_share"] = round(rep["cut_edges_directed"] / rep["num_edges"], 4)
            row["halo_rows"] = rep["comm_volume"]
            row["node_balance"] = round(rep["node_balance"], 3)
        append(record, {"step": "partition lp-metis", "setting": "features from source", **row})
    out = work / "run-papers-sage-minibatch"
    if (pdir / "meta.json").exists() and not ns.predict_only:
        train_papers(ns, graph, pdir, out, logs, record)
    if (out / "model.pt").exists():
        predict_papers(ns, graph, out, logs, record)


def predict_papers(ns: argparse.Namespace, graph: Path, out: Path, logs: Path, record: Path) -> None:
    """Target 4 on the papers run: ``commgnn predict --nodes test``, exact layer-wise scores
    of the 200,000 test nodes computed on their receptive field alone (every node's
    ``[N, C]`` scores would be 69 GB), the rows each layer computed, and the exact test
    accuracy they give."""
    import numpy as np
    import torch

    scores = out.parent / "scores-papers-test.pt"
    row = commgnn(["predict", str(out), "--nodes", "test", "--out", str(scores)], ns.cap_gb,
                  logs / "predict-papers.log")
    if scores.exists() and "error" not in row:
        got = torch.load(scores, weights_only=True)
        y = np.load(graph / "y.npy", mmap_mode="r")
        nodes = got["nodes"].numpy()
        row["nodes_scored"] = int(nodes.size)
        row["test_acc_exact"] = round(float((got["scores"].argmax(1).numpy() == y[nodes]).mean()), 4)
        row["receptive_rows"] = "/".join(str(int(v)) for v in got["receptive_rows"])  # features, layer 1, targets
        scores.unlink()
    append(record, {"step": "predict --nodes test (layer-wise, receptive field)", "setting": "", **row})
    report_row(ns, out, logs, record)


def train_papers(ns: argparse.Namespace, graph: Path, pdir: Path, out: Path, logs: Path, record: Path) -> None:
    """Target 3's training: one epoch of mini-batch GraphSAGE 2 x 128 (15,10, batch 1024;
    about 245 steps a rank) on 4 ranks from the partition directory, the owners sampling
    their own nodes, evaluation by sampling 100,000 nodes of each split, no ``predictions.pt``
    (``[N, C]`` float32 would be 69 GB on rank 0); each step's wall time is in the run's
    ``metrics.jsonl`` (``step_s``)."""
    shutil.rmtree(out, ignore_errors=True)
    args = ["train", "--dataset", str(graph), "--partition-dir", str(pdir), "--parts", "4", "--mode", "minibatch",
            "--model", "sage", "--layers", "2", "--hidden", "128", "--sampler", "neighbor", "--fanout", "15,10",
            "--batch-size", "1024", "--topology", "partitioned", "--inference", "sampled", "--eval-nodes", "100000",
            "--no-predictions", "--epochs", "1", "--patience", "0", "--no-energy", "--timeout", "1800", "--quiet", "--out", str(out),
            "--memory-limit-gb", str(ns.preflight_gb or ns.cap_gb)]
    with DiskPeak(out.parent) as disk:
        row = commgnn(args, ns.cap_gb, logs / "train-papers.log")
    row["disk_added_peak_gb"] = disk.added_gb
    if (out / "summary.json").exists():
        s = json.loads((out / "summary.json").read_text())
        m = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
        steps = m["step_s"]
        row["epoch_s"] = round(s["epoch_time_s"], 1)
        row["train_loop_s"] = round(m["train_loop_s"], 1)
        row["steps_per_rank"] = m["steps"]
        row["step_s_median"] = round(sorted(steps)[len(steps) // 2], 3)
        row["step_s_max"] = round(max(steps), 3)
        row["sampled_edges_per_s"] = round(m["sampled_edges_per_step"] * m["steps"] * 4 / m["train_loop_s"])
        row["rank_peak_gb"] = round(s["peak_rss_mb"] / 1024, 2)
        for split in ("train", "val", "test"):
            row[f"{split}_acc_sampled"] = round(m[f"{split}_acc"], 4)
        row["eval_scored_nodes"] = m.get("eval_scored_nodes", "")
        row["run_disk_gb"] = du_gb(out)
    append(record, {"step": "train sage minibatch", "setting": "15,10 b1024, sampled evaluation of 100k nodes a split",
                    **row})


def report(record: Path, title: str, notes: list[str], parts_meta: Path | None = None) -> None:
    rows = [json.loads(line) for line in record.read_text().splitlines() if line.strip()]
    if parts_meta is not None and parts_meta.exists():  # every training row against the same floor
        meta = json.loads(parts_meta.read_text())
        for r in rows:
            if str(r.get("step", "")).startswith("train ") and "floor_gb" in r:
                floor = floor_bytes(meta, layers=3, hidden=128, model=r["step"].split()[1])
                r["floor_gb"] = round(floor / GB, 3)
                r["measured_over_floor"] = round(r["peak_pss_gb"] * GB / floor, 2)
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    write_table([{k: r.get(k, "") for k in keys} for r in rows], record.with_suffix(""), title, notes)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", choices=("products", "big10m", "papers"), default="products")
    ap.add_argument("--work", default="/tmp/big")
    ap.add_argument("--cap-gb", type=float, default=20.0)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--partitioners", nargs="+", default=["lp-metis", "random"])
    ap.add_argument("--models", nargs="+", default=["gcn", "sage"])
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS))
    ap.add_argument("--regenerate", action="store_true")
    ap.add_argument("--train-only", action="store_true", help="reuse the graph and partitions in --work")
    ap.add_argument("--preflight-gb", type=float, default=None,
                    help="train's --memory-limit-gb (default: the cap); larger measures past the estimate")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--predict-only", action="store_true",
                    help="predict (and report) with the runs already in --work")
    ns = ap.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    csv_path = RESULTS / f"{datetime.date.today()}-{ns.target}.jsonl"  # the .csv and .md are made from it
    work = Path(ns.work)
    if not ns.report_only:
        {"products": products, "big10m": big10m, "papers": papers}[ns.target](ns, work, csv_path)
    report(csv_path, f"Large graph from disk: {ns.target} ({datetime.date.today()})", [
        f"Every step ran alone inside a memory cgroup capped at {ns.cap_gb:g} GB "
        "(commgnn/metrics/memcap.py; page cache counts and is reclaimed). 4 local gloo ranks on the 2 cores.",
        "peak_pss_gb: the largest sum of PSS over the step's processes at one 0.5 s sample (launcher, fork "
        "server and ranks); peak_anon_gb / peak_file_gb: its anonymous and file-backed parts; cgroup_peak_gb: "
        "the cgroup's own peak charge, page cache included; largest_process_gb: the largest single process.",
        "floor_gb (training rows): owned + halo feature rows, one int32 CSR per direction, each layer's "
        "aggregated input and masks kept for backward, the largest hidden halo block in flight, logits, weights "
        "with Adam state, summed over ranks (floor_bytes in benchmarks/large_graphs.py); measured_over_floor "
        "divides peak_pss_gb (interpreters included) by it.",
        f"Command: python benchmarks/large_graphs.py --target {ns.target} --work {ns.work}",
    ], parts_meta=work / f"parts-{ns.partitioners[0]}" / "meta.json" if ns.target == "products" else None)
    print(f"wrote {csv_path.with_suffix('.md')}")


if __name__ == "__main__":
    main()
