"""The ``commgnn`` command: ``train``, ``partition``, ``bench``, ``predict``, ``report``,
``cluster`` and ``datasets``.

User errors (bad flags, config, data, partition directories, a busy port) print one
line, ``commgnn: error: ...``, and exit with code 2, without a traceback. A rank that dies
exits 1, naming the rank.
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from commgnn.errors import RankFailure, Terminated, UserError


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML file with [data] [partition] [model] [train] [runtime] [output]")
    p.add_argument("--dataset", help="'synthetic', a dataset name (see `commgnn datasets`) or a .pt graph")
    p.add_argument("--data-root", dest="data_root",
                   help="folder with staged datasets (default: $COMMGNN_DATA_ROOT, else PyG downloads)")
    p.add_argument("--parts", type=int, help="number of partitions / ranks P")
    p.add_argument("--partitioner", help="metis | ldg (streaming, about half METIS's memory) | random | contiguous")
    p.add_argument("--partition-memory-gb", dest="partition_memory_gb", type=float,
                   help="refuse to partition above this estimated peak, naming a leaner partitioner "
                        "(0 = available memory)")
    p.add_argument("--objective", help="METIS objective: cut | vol")
    p.add_argument("--place-hosts", dest="place_hosts", type=int,
                   help="place partitions on H hosts of P/H ranks, heaviest halo pairs together")
    p.add_argument("--normalize-features", dest="normalize_features", action="store_const", const=True,
                   help="scale each feature row to sum 1 (PyG's NormalizeFeatures)")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (like every other user error)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"commgnn: error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        sys.exit(2)


def _bits(text: str) -> Any:
    """``8`` -> 8, ``4,8`` -> {forward: 4, backward: 8}, ``adaptive`` -> "adaptive"."""
    if text == "adaptive":
        return text
    try:
        parts = [int(p) for p in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N, FWD,BWD or 'adaptive', got {text!r}") from None
    if len(parts) == 1:
        return parts[0]
    if len(parts) == 2:
        return {"forward": parts[0], "backward": parts[1]}
    raise argparse.ArgumentTypeError(f"expected N, FWD,BWD or 'adaptive', got {text!r}")


def _fanout(text: str) -> list[int]:
    """``15,10`` -> [15, 10] (hop 1 first)."""
    try:
        return [int(p) for p in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 15,10, got {text!r}") from None


def _fetch_bits(text: str) -> Any:
    """``4`` -> 4, ``adaptive`` -> "adaptive"."""
    if text == "adaptive":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 1, 2, 4, 8, 32 or 'adaptive', got {text!r}") from None


def _default_text(value: Any) -> str:
    """A config default as the help text shows it."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


class _DefaultsFormatter(argparse.HelpFormatter):
    """Help formatter that appends "(default: X)" to every flag that sets a config key
    (``FLAG_KEYS``, or ``keys`` where a dest maps to another key, or to None for none), X
    read from a default ``RunConfig`` only when help is shown, so that building the parser
    stays cheap. Help that already says ``default:`` (a default that is no plain value,
    such as "a new dated folder") keeps its own words."""

    def __init__(self, prog: str, *, keys: dict[str, str | None], **kwargs: Any) -> None:
        super().__init__(prog, **kwargs)
        self._keys = keys

    def _get_help_string(self, action: argparse.Action) -> str | None:
        from commgnn.runner.config import FLAG_KEYS, default_for_key

        text = action.help
        key = self._keys.get(action.dest, FLAG_KEYS.get(action.dest))
        if not key or text is None or text == argparse.SUPPRESS or "default:" in text:
            return text
        shown = _default_text(default_for_key(key)).replace("%", "%%")  # argparse %-formats help
        return f"{text} (default: {shown})"


def _show_defaults(parser: argparse.ArgumentParser, keys: dict[str, str | None] | None = None) -> None:
    """Make ``parser``'s ``--help`` show each config flag's default (see :class:`_DefaultsFormatter`)."""
    parser.formatter_class = functools.partial(_DefaultsFormatter, keys=dict(keys or {}))  # type: ignore[assignment]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="commgnn", description="Communication-efficient distributed GNN training.")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    t = sub.add_parser("train", help="train a GNN partition-parallel (default: synthetic graph)")
    _add_common(t)
    t.add_argument("--model", help="gcn | sage | gat")
    t.add_argument("--layers", type=int, help="message-passing layers")
    t.add_argument("--hidden", type=int, help="hidden width")
    t.add_argument("--dropout", type=float, help="dropout rate")
    t.add_argument("--heads", type=int, help="GAT heads")
    t.add_argument("--activation", help="auto | relu | elu | maxk (MaxK-GNN: k largest per row)")
    t.add_argument("--maxk-k", dest="maxk_k", type=int, help="maxk: entries kept per row")
    t.add_argument("--residual", choices=("none", "res+"),
                   help="none | res+ (DeeperGCN pre-activation residual blocks, LayerNorm; --layers counts "
                        "the blocks)")
    t.add_argument("--checkpoint-activations", dest="checkpoint_activations", action="store_const", const=True,
                   help="res+: recompute each block in the backward pass (less memory, same numbers)")
    t.add_argument("--epochs", type=int, help="maximum epochs")
    t.add_argument("--lr", type=float, help="learning rate")
    t.add_argument("--optimizer", help="adam | sgd (with momentum 0.9)")
    t.add_argument("--kernel", help="CPU aggregation kernels: auto | torch | numba (fused; auto = numba "
                                    "when installed)")
    t.add_argument("--schedule", help="learning-rate schedule: constant | cosine")
    t.add_argument("--patience", type=int, help="early-stopping patience in epochs (0 = off)")
    t.add_argument("--seed", type=int, help="training seed")
    t.add_argument("--partition-dir", dest="partition_dir",
                   help="use a saved partition directory (default: none, partition in memory)")
    t.add_argument("--reorder", choices=("none", "degree", "rcm", "metis"),
                   help="renumber each rank's nodes for cache locality of the aggregation (full-graph "
                        "mode; same results): none | degree | rcm | metis")
    t.add_argument("--timeout", type=float, help="collective time-out in seconds")
    t.add_argument("--threads", type=int, help="intra-op threads per rank (0 = cores / local ranks)")
    t.add_argument("--port", type=int, help="rendezvous port for local ranks (0 = pick a free one)")
    t.add_argument("--backend", help="auto | gloo | nccl")
    t.add_argument("--out", help="run directory (default: runs/<date>-<dataset>-<model>-p<P>)")
    t.add_argument("--embeddings-layer", dest="embeddings_layer", type=int,
                   help="also write embeddings.pt: every node's output of this layer (0-based)")
    t.add_argument("--checkpoint-every", dest="checkpoint_every", type=int,
                   help="write an atomic checkpoint every k epochs (0 = never)")
    t.add_argument("--gc-freeze", dest="gc_freeze", action=argparse.BooleanOptionalAction, default=None,
                   help="keep the heap held at the first epoch out of Python's full garbage collections "
                        "during the epochs (runtime.gc_freeze; off unless the config says otherwise)")
    t.add_argument("--memory-limit-gb", dest="memory_limit_gb", type=float,
                   help="refuse a job whose estimated memory exceeds this (0 = available memory)")
    t.add_argument("--force", action="store_const", const=True,
                   help="start more than 8 local ranks per core")
    t.add_argument("--resume", metavar="RUN_DIR",
                   help="continue RUN_DIR from its newest checkpoint, with its own config.toml "
                        "(--epochs N extends or shortens it)")
    t.add_argument("--quiet", action="store_const", const=True, help="no progress bar or table")
    h = t.add_argument_group("halo levers ([comm.halo])")
    h.add_argument("--precompute", action="store_const", const=True,
                   help="aggregate the input features once (no per-epoch input exchange)")
    h.add_argument("--precompute-dropout", dest="precompute_dropout", choices=["aggregate", "matched"],
                   help="precompute: dropout on the aggregate, or noise matched to the exact model's")
    h.add_argument("--transform-first", dest="transform_first", action="store_const", const=True,
                   help="send W h instead of h where narrower")
    h.add_argument("--bits", type=_bits, help="quantization: 1|2|4|8|32, FWD,BWD (e.g. 4,8) or adaptive")
    h.add_argument("--budget-mb", dest="budget_mb", type=float, help="adaptive bits: MB per rank per epoch")
    h.add_argument("--adapt-every", dest="adapt_every", type=int, help="adaptive bits: re-solve the widths every k epochs")
    h.add_argument("--budget-s", dest="budget_s", type=float,
                   help="adaptive bits: halo exchange seconds per rank per epoch (a time budget)")
    h.add_argument("--sample-rate", dest="sample_rate", type=float, help="fraction of boundary rows sent")
    h.add_argument("--staleness", help="none | pipeline | skip")
    h.add_argument("--stale-threshold", dest="stale_threshold", type=float, help="skip: relative change to resend")
    h.add_argument("--max-age", dest="max_age", type=int, help="skip: oldest a cached row may be (epochs)")
    h.add_argument("--max-error", dest="max_error", type=float,
                   help="pipeline: run the next epoch exact when stale rows were off by more than this (relative)")
    h.add_argument("--exact-every", dest="exact_every", type=int, help="exact refresh every k epochs (0 = never)")
    g = t.add_argument_group("gradient sync ([comm.grad], [comm.gossip])")
    g.add_argument("--grad", help="allreduce | fp16 | bf16 | powersgd | localsgd | topk | cltk | qsgd | signsgd")
    g.add_argument("--ratio", type=float, help="topk, cltk: fraction of entries sent")
    g.add_argument("--half", action="store_const", const=True,
                   help="powersgd, cltk: values travel in fp16")
    g.add_argument("--levels", type=int, help="qsgd: quantization levels")
    g.add_argument("--powersgd-rank", dest="powersgd_rank", type=int, help="powersgd: approximation rank")
    g.add_argument("--grad-start", dest="grad_start", type=int,
                   help="powersgd, localsgd: plain all-reduce steps first (>= 2)")
    g.add_argument("--gossip", help="decentralised averaging instead of all-reduce: ring | torus | "
                   "exponential | full | a graph file (default: none, gradients are all-reduced)")
    g.add_argument("--gossip-method", dest="gossip_method",
                   help="with --gossip: dpsgd | dpsgd-atc | pushsum | tracking | tracking-atc")
    g.add_argument("--gossip-average-every", dest="gossip_average_every", type=int,
                   help="dpsgd: exact model average every k rounds instead of gossip (Gossip-PGA)")

    m = t.add_argument_group("mini-batch training ([train] mode, [minibatch], [fetch])")
    m.add_argument("--mode", help="fullgraph | minibatch")
    m.add_argument("--sampler", help="neighbor | cluster | saint-node | saint-edge | saint-rw | vrgcn")
    m.add_argument("--fanout", type=_fanout, help="neighbours per layer, hop 1 first, e.g. 15,10 (-1 = all)")
    m.add_argument("--batch-size", dest="batch_size", type=int, help="seed nodes per batch (largest rank)")
    m.add_argument("--replace", action="store_const", const=True, help="sample neighbours with replacement")
    m.add_argument("--topology", help="auto | replicated | partitioned (owners sample their own nodes)")
    m.add_argument("--cache-mb", dest="cache_mb", type=float, help="remote-row cache per rank in MB")
    m.add_argument("--cache-ratio", dest="cache_ratio", type=float,
                   help="remote-row cache per rank as a fraction of its remote rows")
    m.add_argument("--cache-policy", dest="cache_policy", help="degree | presample | lru")
    m.add_argument("--fetch-bits", dest="fetch_bits", type=_fetch_bits,
                   help="bits of fetched rows: 1|2|4|8|32 or adaptive (with --fetch-budget-mb)")
    m.add_argument("--fetch-budget-mb", dest="fetch_budget_mb", type=float,
                   help="adaptive fetch bits: MB of rows each rank may receive per epoch")
    m.add_argument("--fetch-sparse", dest="fetch_sparse", action="store_const", const=True,
                   help="fetched rows as lossless index lists / bitmaps (one more all-to-all per step)")
    m.add_argument("--prefetch", action="store_const", const=True,
                   help="sample and fetch the next batch while the current one computes")
    e = t.add_argument_group("energy")
    e.add_argument("--country", help="ISO 3166-1 alpha-3 code of where the run's machines are (grid CO2)")
    e.add_argument("--no-energy", dest="energy_track", action="store_const", const=False,
                   help="do not measure CPU/RAM energy (set COMMGNN_ENERGY=0 for the same)")
    e.add_argument("--network-j-per-byte", dest="network_j_per_byte", type=float,
                   help="joules per byte sent between ranks (network energy model)")

    p = sub.add_parser("partition", help="partition a graph, print its quality report, save it")
    _add_common(p)
    p.add_argument("--seed", type=int, help="partitioner seed")
    p.add_argument("--out", required=True, help="partition directory to write")
    _show_defaults(t)
    _show_defaults(p, {"seed": "partition.seed", "out": None})

    b = sub.add_parser("bench", help="run a grid of configurations and compare them")
    b.add_argument("--grid", required=True, help="grid TOML ([base], [grid], [[halo]] entries)")
    b.add_argument("--out", help="output folder (default: runs/bench-<grid name>); reruns resume")
    b.add_argument("--report-only", dest="report_only", action="store_true",
                   help="tabulate the finished runs in --out without running anything")

    pr = sub.add_parser("predict", help="class scores of every node from a trained run (exact exchange)")
    pr.add_argument("run_dir", metavar="RUN_DIR", help="a finished run directory (with model.pt)")
    pr.add_argument("--dataset", help="another graph with the same features and classes (default: the run's)")
    pr.add_argument("--data-root", dest="data_root", help="folder with staged datasets")
    pr.add_argument("--parts", type=int, help="ranks P (default: the run's)")
    pr.add_argument("--out", help="output file (default: RUN_DIR/predictions-<dataset>.pt)")

    sub.add_parser("datasets", help="list the dataset names commgnn knows")

    r = sub.add_parser("report", help="write one self-contained HTML page for runs and bench grids")
    r.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                   help="run directories (`commgnn train --out`) or `commgnn bench` output folders")
    r.add_argument("--out", default="report.html", help="HTML file to write (default: report.html)")
    r.add_argument("--title", help="page title (default: the directories' names)")

    from commgnn.cli.cluster import add_parser as add_cluster_parser

    add_cluster_parser(sub)
    from commgnn.cli.calibrate import add_parser as add_calibrate_parser

    add_calibrate_parser(sub)
    from commgnn.cli.plan import add_parser as add_plan_parser

    add_plan_parser(sub)
    from commgnn.cli.federate import add_parser as add_federate_parser

    add_federate_parser(sub)
    return parser


def _flags(ns: argparse.Namespace) -> dict[str, Any]:
    return {k: v for k, v in vars(ns).items() if v is not None and k not in ("command", "config")}


def cmd_train(ns: argparse.Namespace) -> int:
    """A thin shell over :func:`commgnn.api.run`: flags and TOML make the config."""
    from commgnn.api import run
    from commgnn.runner.config import resolve_config

    flags = _flags(ns)
    resume = flags.pop("resume", None)
    if resume is None:
        run(resolve_config(ns.config, flags, os.environ), env=os.environ)
        return 0
    run_dir = Path(resume)
    if ns.config or set(flags) - {"epochs", "quiet", "timeout", "threads", "port", "checkpoint_every",
                                     "memory_limit_gb", "force", "gc_freeze"}:
        raise UserError("--resume takes the run's own config.toml; only --epochs, --quiet, --timeout, "
                        "--threads, --port, --checkpoint-every, --memory-limit-gb, --force and "
                        "--[no-]gc-freeze may change")
    if not (run_dir / "config.toml").is_file() or not (run_dir / "manifest.json").is_file():
        raise UserError(f"{run_dir} is not a commgnn run directory (no config.toml and manifest.json)")
    flags["out"] = str(run_dir)
    run(resolve_config(str(run_dir / "config.toml"), flags, os.environ), env=os.environ, resume=True)
    return 0


def partition_to_dir(cfg: Any, out: Path) -> str:
    """Partition ``cfg``'s graph into ``cfg.runtime.parts`` parts, save to ``out``; the report text."""
    from commgnn.runner.prepare import partition_for_run, partition_meta
    from commgnn.data import fingerprint, load_dataset
    from commgnn.partition import PartitionReport, build_local_partitions, format_report, save_partitions

    cfg = replace(cfg, partition=replace(cfg.partition, dir=None))
    data = load_dataset(cfg.data)
    fp = fingerprint(data)
    parts, report = partition_for_run(cfg, data, fp)
    save_partitions(out, build_local_partitions(data, parts, cfg.runtime.parts),
                    partition_meta(cfg, fp, report, data))
    return format_report(PartitionReport.from_dict(report))


def cmd_partition(ns: argparse.Namespace) -> int:
    from commgnn.runner.config import resolve_config

    flags = _flags(ns)
    out = Path(flags.pop("out"))
    seed = flags.pop("seed", None)
    cfg = resolve_config(ns.config, flags, os.environ)
    if seed is not None:
        cfg = replace(cfg, partition=replace(cfg.partition, seed=seed))
    print(partition_to_dir(cfg, out))
    print(f"saved {cfg.runtime.parts} partitions to {out}")
    return 0


def cmd_bench(ns: argparse.Namespace) -> int:
    from commgnn.cli.bench import run_grid

    out = Path(ns.out) if ns.out else Path("runs") / f"bench-{Path(ns.grid).stem}"
    table = run_grid(ns.grid, out, report_only=ns.report_only)
    print(f"{len(table)} configurations; tables and pareto.png in {out}")
    return 0


def cmd_predict(ns: argparse.Namespace) -> int:
    from commgnn.cli.predict import predict

    name = Path(ns.dataset).stem if ns.dataset else "run"
    out = Path(ns.out) if ns.out else Path(ns.run_dir) / f"predictions-{name}.pt"
    scores = predict(Path(ns.run_dir), out=out, dataset=ns.dataset, data_root=ns.data_root, parts=ns.parts)
    print(f"{scores.shape[0]} nodes x {scores.shape[1]} classes -> {out}")
    return 0


def cmd_report(ns: argparse.Namespace) -> int:
    from commgnn.report.html import write_report

    out = write_report(ns.run_dirs, ns.out, title=ns.title)
    print(f"wrote {out} ({out.stat().st_size / 1e3:.0f} KB) for {len(ns.run_dirs)} "
          f"{'directory' if len(ns.run_dirs) == 1 else 'directories'}")
    return 0


def cmd_cluster(ns: argparse.Namespace) -> int:
    from commgnn.cli.cluster import cmd_cluster as run

    return run(ns)


def cmd_calibrate(ns: argparse.Namespace) -> int:
    from commgnn.cli.calibrate import cmd_calibrate as run

    return run(ns)


def cmd_plan(ns: argparse.Namespace) -> int:
    from commgnn.cli.plan import cmd_plan as run

    return run(ns)


def cmd_federate(ns: argparse.Namespace) -> int:
    from commgnn.cli.federate import cmd_federate as run

    return run(ns)


def cmd_datasets(_: argparse.Namespace) -> int:
    from commgnn.data import dataset_names

    print("\n".join(["synthetic", *dataset_names()]))
    return 0


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.command is None:
        parser.print_help()
        return 2
    handler = {"train": cmd_train, "partition": cmd_partition, "bench": cmd_bench,
               "datasets": cmd_datasets, "predict": cmd_predict, "report": cmd_report, "cluster": cmd_cluster,
               "calibrate": cmd_calibrate, "plan": cmd_plan, "federate": cmd_federate}[ns.command]
    # SIGTERM ends a run like Ctrl-C: ranks stopped, run directory marked interrupted.
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if _main_thread() else None
    try:
        return handler(ns)
    except UserError as exc:
        print(f"commgnn: error: {exc}", file=sys.stderr)
        return 2
    except RankFailure as exc:
        print(f"commgnn: error: {exc}", file=sys.stderr)
        return 1
    except Terminated:
        print("commgnn: terminated (SIGTERM)", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("commgnn: interrupted", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


if __name__ == "__main__":
    sys.exit(main())
