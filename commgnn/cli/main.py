"""The ``commgnn`` command: ``train``, ``partition``, ``bench``, ``predict``, ``report``,
``datasets``, ``cluster``, ``calibrate``, ``plan`` and ``federate``.

Each command parses its arguments and calls the Python API (:mod:`commgnn.api`). The
commands defined in their own modules (:data:`COMMANDS`) are loaded by name when used, so
that no command module imports another's names; the parser pieces they share live in
:mod:`commgnn.cli.common`.

User errors (bad flags, config, data, partition directories, a busy port) print one
line, ``commgnn: error: ...``, and exit with code 2, without a traceback. A rank that dies
exits 1, naming the rank.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from pathlib import Path
from typing import Any, Sequence

from commgnn.cli.common import Parser, add_train_arguments, given
from commgnn.errors import RankFailure, Terminated, UserError

COMMANDS = {"cluster": "commgnn.cli.cluster", "calibrate": "commgnn.cli.calibrate", "plan": "commgnn.cli.plan",
            "federate": "commgnn.cli.federate", "datasets": "commgnn.cli.datasets"}
"""Commands in modules of their own: each has ``add_parser(sub, help)`` and ``run(ns) -> int``."""

HELP = {"train": "train a GNN partition-parallel (default: synthetic graph)",
        "partition": "partition a graph, print its quality report, save it",
        "bench": "run a grid of configurations and compare them",
        "predict": "class scores of every node, or of chosen ones, from a trained run (exact exchange)",
        "datasets": "list the dataset names commgnn knows; make, check or convert graph folders",
        "report": "write one self-contained HTML page for runs and bench grids",
        "cluster": "run `train` on H emulated hosts (network namespaces, shaped links)",
        "calibrate": "ping-pong, all-to-all and all-reduce microbenchmark: the links' alpha-beta model",
        "plan": "rank communication plans by predicted time to accuracy on a cluster",
        "federate": "federated training: clients keep their subgraphs, a server averages their updates "
                    "(FedAvg / FedProx, secure aggregation, DP)"}
"""Each command's line in ``commgnn --help`` (here, so that listing them imports none)."""


def _flags(ns: argparse.Namespace) -> dict[str, Any]:
    """The options given on the command line (kept for callers of earlier releases)."""
    return given(ns)


def _add_partition(p: argparse.ArgumentParser) -> None:
    from commgnn.runner.config import DATA_OPTIONS, PARTITION_OPTIONS, RUN_OPTIONS

    keep = {o.dest for o in (*DATA_OPTIONS, *PARTITION_OPTIONS)}
    p.add_argument("--config", help="TOML file with [data] [partition] [runtime] tables; flags override it")
    RUN_OPTIONS.add_arguments(p, only=lambda o: o.dest in keep)
    RUN_OPTIONS.add_flag(p, RUN_OPTIONS.by_dest["partition_seed"], "--seed")
    p.add_argument("--out", required=True, help="partition directory to write")


def _add_own(sub: Any, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=HELP[name])
    if name == "train":
        add_train_arguments(p)
    elif name == "partition":
        _add_partition(p)
    elif name == "bench":
        p.add_argument("--grid", required=True, help="grid TOML ([base], [grid], [[halo]] entries)")
        p.add_argument("--out", help="output folder (default: runs/bench-<grid name>); reruns resume")
        p.add_argument("--report-only", dest="report_only", action="store_true",
                       help="tabulate the finished runs in --out without running anything")
    elif name == "predict":
        p.add_argument("run_dir", metavar="RUN_DIR", help="a finished run directory (with model.pt)")
        p.add_argument("--dataset", help="another graph with the same features and classes (default: the run's)")
        p.add_argument("--data-root", dest="data_root", help="folder with staged datasets")
        p.add_argument("--parts", type=int, help="ranks P (default: the run's)")
        p.add_argument("--out", help="output file (default: RUN_DIR/predictions-<dataset>.pt)")
        p.add_argument("--nodes", help="score only these nodes: a split (train, val, test) or a .npy file of node "
                       "ids; the output then holds {'nodes': ids, 'scores': [k, C]}")
    elif name == "report":
        p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                       help="run directories (`commgnn train --out`) or `commgnn bench` output folders")
        p.add_argument("--out", default="report.html", help="HTML file to write (default: report.html)")
        p.add_argument("--title", help="page title (default: the directories' names)")
    return p


def build_parser(commands: set[str] | None = None) -> argparse.ArgumentParser:
    """The ``commgnn`` parser. ``commands``: build only these subcommands' flags (the others
    are listed with their help line), so that parsing one command imports only its
    configs; None: every command's."""
    parser = Parser(prog="commgnn", description="Communication-efficient distributed GNN training.")
    sub = parser.add_subparsers(dest="command", parser_class=Parser)
    for name in HELP:
        if commands is not None and name not in commands:
            sub.add_parser(name, help=HELP[name])
        elif name in COMMANDS:
            importlib.import_module(COMMANDS[name]).add_parser(sub, HELP[name])
        else:
            _add_own(sub, name)
    return parser


def cmd_train(ns: argparse.Namespace) -> int:
    """A thin shell over :func:`commgnn.api.run`: flags and TOML make the config."""
    from commgnn.api import run
    from commgnn.runner.config import RUN_OPTIONS, resolve_config

    flags = given(ns)
    resume = flags.pop("resume", None)
    if resume is None:
        run(resolve_config(ns.config, flags, os.environ), env=os.environ)
        return 0
    run_dir = Path(resume)
    RUN_OPTIONS.check_resume({**flags, "config": ns.config})
    if not (run_dir / "config.toml").is_file() or not (run_dir / "manifest.json").is_file():
        raise UserError(f"{run_dir} is not a commgnn run directory (no config.toml and manifest.json)")
    flags["out"] = str(run_dir)
    run(resolve_config(str(run_dir / "config.toml"), flags, os.environ), env=os.environ, resume=True)
    return 0


def cmd_partition(ns: argparse.Namespace) -> int:
    from commgnn.api.partition import partition_graph

    flags = given(ns)
    out = flags.pop("out")
    done = partition_graph(out, config=ns.config, **flags)
    print(done.text)
    print(f"saved {done.parts} partitions to {out}")
    return 0


def cmd_bench(ns: argparse.Namespace) -> int:
    from commgnn.api.bench import bench

    out = Path(ns.out) if ns.out else Path("runs") / f"bench-{Path(ns.grid).stem}"
    table = bench(ns.grid, out, report_only=ns.report_only)
    print(f"{len(table)} configurations; tables and pareto.png in {out}")
    return 0


def cmd_predict(ns: argparse.Namespace) -> int:
    from commgnn.api.predict import predict

    name = Path(ns.dataset).stem if ns.dataset else "run"
    if ns.nodes:
        name += f"-{Path(ns.nodes).stem}"
    out = Path(ns.out) if ns.out else Path(ns.run_dir) / f"predictions-{name}.pt"
    scores = predict(Path(ns.run_dir), ns.dataset, out=out, data_root=ns.data_root, parts=ns.parts, nodes=ns.nodes)
    print(f"{scores.shape[0]} nodes x {scores.shape[1]} classes -> {out}")
    return 0


def cmd_report(ns: argparse.Namespace) -> int:
    from commgnn.report.html import write_report

    out = write_report(ns.run_dirs, ns.out, title=ns.title)
    print(f"wrote {out} ({out.stat().st_size / 1e3:.0f} KB) for {len(ns.run_dirs)} "
          f"{'directory' if len(ns.run_dirs) == 1 else 'directories'}")
    return 0


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[0] if args and not args[0].startswith("-") else None
    parser = build_parser({command} if command else set())
    ns = parser.parse_args(args)
    if ns.command is None:
        parser.print_help()
        return 2
    own = {"train": cmd_train, "partition": cmd_partition, "bench": cmd_bench,
           "predict": cmd_predict, "report": cmd_report}
    handler = own.get(ns.command) or importlib.import_module(COMMANDS[ns.command]).run
    # SIGTERM ends a run like Ctrl-C: ranks stopped, run directory marked interrupted.
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if _main_thread() else None
    try:
        return int(handler(ns))
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
