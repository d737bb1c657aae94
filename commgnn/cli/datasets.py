"""``commgnn datasets [list | synth | check | convert-ogb]``: a thin shell over
:mod:`commgnn.api.datasets`."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from commgnn.cli.common import given


def add_parser(sub: Any, help: str) -> None:
    from commgnn.api.datasets import SYNTH_OPTIONS

    p = sub.add_parser("datasets", help=help, description="Without a subcommand: list the dataset names.")
    verbs = p.add_subparsers(dest="datasets_command", parser_class=type(p))
    verbs.add_parser("list", help="the dataset names commgnn knows (the default)")
    s = verbs.add_parser("synth", help="generate a big synthetic graph folder chunk by chunk (power-law "
                                       "degrees, communities, labels that follow them)")
    s.add_argument("--out", required=True, help="graph folder to write")
    s.add_argument("--config", help="TOML file with the generator's keys; flags override it")
    s.add_argument("--quiet", action="store_true", help="no progress lines")
    SYNTH_OPTIONS.add_arguments(s)
    c = verbs.add_parser("check", help="stream-validate a graph folder and print its fingerprint")
    c.add_argument("path", metavar="FOLDER", help="a graph folder (meta.json and .npy files)")
    o = verbs.add_parser("convert-ogb", help="convert OGB's raw folder of a node-property dataset into a "
                                             "graph folder, chunk by chunk")
    o.add_argument("src", metavar="OGB_FOLDER", help="the dataset's folder as ogb downloads it (raw/, split/)")
    o.add_argument("--out", required=True, help="graph folder to write")
    o.add_argument("--split", help="split scheme under split/ (default: the dataset's own)")
    o.add_argument("--undirected", action=argparse.BooleanOptionalAction, default=None,
                   help="store each edge in both directions (default: as PyG's OGB loader does)")
    o.add_argument("--x-dtype", dest="x_dtype", choices=("float32", "float16"),
                   help="feature dtype (default: the source's)")


def run(ns: argparse.Namespace) -> int:
    from commgnn.api import datasets as api

    verb = ns.datasets_command or "list"
    if verb == "list":
        from commgnn.data import dataset_names

        print("\n".join(["synthetic", *dataset_names()]))
    elif verb == "synth":
        t0 = time.perf_counter()

        def show(msg: str) -> None:
            print(f"[{time.perf_counter() - t0:7.1f}s] {msg}", file=sys.stderr, flush=True)

        out = api.synth_graph(ns.out, config=ns.config, progress=None if ns.quiet else show,
                              **given(ns, drop=("command", "datasets_command", "config", "out", "quiet")))
        print(f"wrote {out} in {time.perf_counter() - t0:.1f} s")
    elif verb == "check":
        t0 = time.perf_counter()
        done = api.check_dataset(ns.path)
        m = done.meta
        print(f"{ns.path}: {m['num_nodes']:,} nodes, {m['num_edges']:,} edges, {m['num_features']} features, "
              f"{m['num_classes']} classes; checked in {time.perf_counter() - t0:.1f} s")
        print(f"fingerprint {done.fingerprint}")
    else:
        out = api.convert_ogb(ns.src, ns.out, undirected=ns.undirected, split=ns.split, x_dtype=ns.x_dtype)
        print(f"wrote {out}")
    return 0
