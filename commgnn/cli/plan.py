"""``commgnn plan``: probe communication plans, rank them for a cluster, write the best
(:func:`commgnn.api.plan.plan`).

    commgnn plan --dataset CS --model gcn --layers 3 --hosts 2 --ranks-per-host 2 \\
        --rate 50mbit [--delay 5ms | --net calibrated.json] --tolerance 0.5 --out plan.toml
    commgnn train --config plan.toml ...
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from commgnn.cli.common import given



def add_parser(sub: Any, help: str) -> None:
    from commgnn.api.plan import PLAN_OPTIONS, PLAN_RUN_KEYWORDS
    from commgnn.runner.config import RUN_OPTIONS

    p = sub.add_parser("plan", help=help)
    p.add_argument("--config", help="TOML file to start from (the planned run)")
    RUN_OPTIONS.add_arguments(p, only=lambda o: o.dest in PLAN_RUN_KEYWORDS)
    PLAN_OPTIONS.add_arguments(p)


def run(ns: argparse.Namespace) -> int:
    from commgnn.api.plan import format_table, plan

    done = plan(config=ns.config, env=os.environ, **given(ns))
    print(format_table(done.ranked, done.residual))
    if done.reason:
        print(done.reason)
    print(f"chosen: {done.chosen.name} -> {done.out}")
    return 0
