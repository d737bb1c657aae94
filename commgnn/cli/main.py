"""The ``commgnn`` command: ``train``, ``partition`` and ``datasets``.

User errors (bad flags, config, data, partition directories, a busy port) print one
line, ``commgnn: error: ...``, and exit with code 2, without a traceback. A rank that dies
exits 1, naming the rank.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from commgnn.errors import RankFailure, UserError


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML file with [data] [partition] [model] [train] [runtime] [output]")
    p.add_argument("--dataset", help="'synthetic' (default), a dataset name (see `commgnn datasets`) or a .pt graph")
    p.add_argument("--data-root", dest="data_root",
                   help="folder with staged datasets (default: $COMMGNN_DATA_ROOT, else PyG downloads)")
    p.add_argument("--parts", type=int, help="number of partitions / ranks P")
    p.add_argument("--partitioner", help="metis | random | contiguous")
    p.add_argument("--objective", help="METIS objective: cut | vol")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="commgnn", description="Communication-efficient distributed GNN training.")
    sub = parser.add_subparsers(dest="command")

    t = sub.add_parser("train", help="train a GNN partition-parallel (default: synthetic graph)")
    _add_common(t)
    t.add_argument("--model", help="gcn | sage | gat")
    t.add_argument("--layers", type=int, help="message-passing layers")
    t.add_argument("--hidden", type=int, help="hidden width")
    t.add_argument("--dropout", type=float, help="dropout rate")
    t.add_argument("--heads", type=int, help="GAT heads")
    t.add_argument("--epochs", type=int, help="maximum epochs")
    t.add_argument("--lr", type=float, help="learning rate")
    t.add_argument("--patience", type=int, help="early-stopping patience in epochs (0 = off)")
    t.add_argument("--seed", type=int, help="training seed")
    t.add_argument("--partition-dir", dest="partition_dir", help="use a saved partition directory")
    t.add_argument("--timeout", type=float, help="collective time-out in seconds (default 120)")
    t.add_argument("--threads", type=int, help="intra-op threads per rank (0 = cores / local ranks)")
    t.add_argument("--port", type=int, help="rendezvous port for local ranks (0 = pick a free one)")
    t.add_argument("--backend", help="auto | gloo | nccl")
    t.add_argument("--out", help="run directory (default: runs/<date>-<dataset>-<model>-p<P>)")
    t.add_argument("--quiet", action="store_const", const=True, help="no progress bar or table")

    p = sub.add_parser("partition", help="partition a graph, print its quality report, save it")
    _add_common(p)
    p.add_argument("--seed", type=int, help="partitioner seed")
    p.add_argument("--out", required=True, help="partition directory to write")

    sub.add_parser("datasets", help="list the dataset names commgnn knows")
    return parser


def _flags(ns: argparse.Namespace) -> dict[str, Any]:
    return {k: v for k, v in vars(ns).items() if v is not None and k not in ("command", "config")}


def cmd_train(ns: argparse.Namespace) -> int:
    from commgnn.cli.config import resolve_config
    from commgnn.cli.run import train_command

    cfg = resolve_config(ns.config, _flags(ns), os.environ)
    train_command(cfg, os.environ)
    return 0


def cmd_partition(ns: argparse.Namespace) -> int:
    from commgnn.cli.config import resolve_config
    from commgnn.data import fingerprint, load_dataset
    from commgnn.errors import PartitionError
    from commgnn.partition import (build_local_partitions, format_report, partition_graph,
                                   partition_report, save_partitions)

    flags = _flags(ns)
    out = Path(flags.pop("out"))
    seed = flags.pop("seed", None)
    cfg = resolve_config(ns.config, flags, os.environ)
    if seed is not None:
        cfg = replace(cfg, partition=replace(cfg.partition, seed=seed))
    P = cfg.runtime.parts
    data = load_dataset(cfg.data)
    if P > data.num_nodes:
        raise PartitionError(f"cannot split {data.num_nodes} nodes into {P} partitions")
    fp = fingerprint(data)
    parts = partition_graph(data.edge_index, data.num_nodes, P, cfg.partition)
    report = partition_report(data.edge_index, parts, P, data.train_mask)
    meta = {"graph_fingerprint": fp, "dataset": cfg.data.dataset, "method": cfg.partition.method,
            "objective": cfg.partition.objective, "seed": cfg.partition.seed, "report": report.to_dict()}
    save_partitions(out, build_local_partitions(data, parts, P), meta)
    print(format_report(report))
    print(f"saved {P} partitions to {out}")
    return 0


def cmd_datasets(_: argparse.Namespace) -> int:
    from commgnn.data import dataset_names

    print("\n".join(["synthetic", *dataset_names()]))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.command is None:
        parser.print_help()
        return 2
    handler = {"train": cmd_train, "partition": cmd_partition, "datasets": cmd_datasets}[ns.command]
    try:
        return handler(ns)
    except UserError as exc:
        print(f"commgnn: error: {exc}", file=sys.stderr)
        return 2
    except RankFailure as exc:
        print(f"commgnn: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("commgnn: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
