"""The parser pieces the ``commgnn`` commands share: a parser whose usage error is one
line, the flags of a run, of a federated run and of a calibration (generated from their
option sets, :mod:`commgnn.options`), and the options given on a command line."""

from __future__ import annotations

import argparse
import sys
from typing import Any

RESUME_HELP = "continue RUN_DIR from its newest checkpoint, with its own config.toml (--epochs N extends or shortens it)"


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (like every other user error)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"commgnn: error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        sys.exit(2)


def given(ns: argparse.Namespace, *, drop: tuple[str, ...] = ("command", "config")) -> dict[str, Any]:
    """The options given on the command line (``{dest: value}``, those not given left out)."""
    return {k: v for k, v in vars(ns).items() if v is not None and k not in drop}


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    """``commgnn train``'s flags: ``--config``, ``--resume`` and one per run option, grouped
    by config table."""
    from commgnn.runner.config import RUN_OPTIONS

    p.usage = f"{p.prog} [--config FILE] [--resume RUN_DIR] [OPTIONS] (each [table] key is an option)"
    p.add_argument("--config", help="TOML file with [data] [partition] [model] [train] [comm] [runtime] [minibatch] "
                                    "[fetch] [energy] [output] tables; flags override it")
    p.add_argument("--resume", metavar="RUN_DIR", help=RESUME_HELP)
    RUN_OPTIONS.add_arguments(p)


def add_federate_arguments(p: argparse.ArgumentParser) -> None:
    """``commgnn federate``'s flags: ``--config`` and one per federate option."""
    from commgnn.federated.options import FEDERATE_OPTIONS

    p.usage = f"{p.prog} [--config FILE] [--resume RUN_DIR] [OPTIONS] (each [table] key is an option)"
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a stopped federated run from its newest checkpoint, "
                   "with its own config.toml (--rounds N extends or shortens it)")
    p.add_argument("--config", help="TOML file with [data] [split] [federated] [neighgen] [uplink] [secagg] [dp] "
                                    "[policy] [runtime] [output]; flags override it")
    FEDERATE_OPTIONS.add_arguments(p)


def add_calibrate_arguments(p: argparse.ArgumentParser) -> None:
    """``commgnn calibrate``'s flags."""
    from commgnn.api.calibrate import CALIBRATE_OPTIONS

    CALIBRATE_OPTIONS.add_arguments(p)
