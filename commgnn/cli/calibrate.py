"""``commgnn calibrate``: measure the cluster's links and write their alpha-beta model
(:func:`commgnn.api.calibrate.calibrate`)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from commgnn.cli.common import add_calibrate_arguments, given



def add_parser(sub: Any, help: str) -> None:
    add_calibrate_arguments(sub.add_parser("calibrate", help=help))


def run(ns: argparse.Namespace) -> int:
    from commgnn.api.calibrate import calibrate, describe

    model = calibrate(env=os.environ, **given(ns, drop=("command",)))
    if model:  # rank 0 (or the local launcher)
        print(describe(model))
    return 0
