"""Federated training from a script or a notebook (what ``commgnn federate`` calls).

::

    import commgnn
    result = commgnn.federate("cora", clients=5, rounds=100, out="runs/fed")
    result.summary        # summary.json as a dict (test accuracy at the best validation round, bytes, ...)
    result.curve          # metrics.jsonl's rows, one per evaluation
    result.run_dir        # the run folder

    commgnn.resume("runs/fed", rounds=200)   # a federated run folder continues from its checkpoint

The run goes through the shared runner (:mod:`commgnn.runner.federate`): the same run
folder, ``status.json``, manifest, logs, pre-flight, launch and fault handling as
``commgnn train``. Under ``torchrun`` the same call runs on every rank and rank 0 gets the
result (the others ``None``). Errors raise :mod:`commgnn.errors` types: a
:class:`~commgnn.errors.UserError` (bad input; :class:`~commgnn.errors.ConfigError` for a
bad setting) or a :class:`~commgnn.errors.RankFailure`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from commgnn.config import replace_path
from commgnn.errors import UserError
from commgnn.federated.config import FederateConfig
from commgnn.federated.options import FEDERATE_OPTIONS, resolve_federate_config
from commgnn.report import read_json
from commgnn.runner.federate import default_out_dir, federate_command, is_federated_run

__all__ = ["FederateResult", "federate", "is_federated_run", "load_federate_result", "resume_federated",
           "run_federation"]

@dataclass(frozen=True)
class FederateResult:
    """What a federated run gives back."""

    summary: dict[str, Any]
    """``summary.json``: test accuracy at the best validation round, worst client, bytes, DP."""
    curve: list[dict[str, Any]]
    """``metrics.jsonl``: one row per evaluation (round, accuracies, bytes so far, ...)."""
    run_dir: Path
    """The run folder."""


def _config(config: FederateConfig | str | Path | None, options: Mapping[str, Any]) -> FederateConfig:
    """``config`` (a config, a TOML file or the defaults) with the keyword ``options`` applied,
    checked once: every federate option (:data:`~commgnn.federated.options.FEDERATE_OPTIONS`)
    is one, by the Python name of its flag (``dp_epsilon=4`` is ``--dp-epsilon 4``)."""
    FEDERATE_OPTIONS.unknown(list(options), "the flags of `commgnn federate` by their Python names")
    if isinstance(config, FederateConfig):
        return resolve_federate_config(None, dict(options), {}, start=config)
    return resolve_federate_config(str(config) if config is not None else None, dict(options), {})


def federate(data: Any = None, *, config: FederateConfig | str | Path | None = None, out: str | Path | None = None,
             env: Mapping[str, str] | None = None, **options: Any) -> FederateResult | None:
    """Train a federation on ``data`` and return the result.

    Args:
        data: a PyG ``Data``, a dict of tensors, an ``InMemoryDataset``, a dataset name or a
            ``.pt`` path; None = the config's dataset.
        config: a :class:`FederateConfig`, or a TOML file, to start from.
        out: the run folder (default ``runs/federate-<dataset>-<algorithm>-<time>``).
        env: where to look for ``torchrun``'s variables (default ``os.environ``).
        **options: any ``commgnn federate`` flag by its Python name, e.g. ``clients=5``,
            ``rounds=100``, ``participation=0.5``, ``dp_epsilon=4.0``, ``parts=3``,
            ``checkpoint_every=10``, ``quiet=True``; ``seed`` sets the split's and the
            training's seed.
    """
    cfg = _config(config, options)
    graph = None
    if isinstance(data, (str, Path)):
        cfg = replace_path(cfg, "data.dataset", str(data))
    elif data is not None:
        graph = data
    if out is not None:
        cfg = replace_path(cfg, "output.out", str(out))
    return run_federation(cfg, env=os.environ if env is None else env, graph=graph)


def run_federation(cfg: FederateConfig, *, env: Mapping[str, str], graph: Any = None,
                   resume: bool = False) -> FederateResult | None:
    """Run with a resolved configuration (what the CLI calls); None on a torchrun rank
    other than 0."""
    if cfg.output.out is None:
        cfg = replace_path(cfg, "output.out", str(default_out_dir(cfg, graph=graph)))
    summary = federate_command(cfg, env, resume=resume, graph=graph)
    if summary is None:
        return None
    return load_federate_result(cfg.output.out)  # type: ignore[arg-type]


def resume_federated(run_dir: str | Path, data: Any = None, *, rounds: int | None = None,
                     env: Mapping[str, str] | None = None, **options: Any) -> FederateResult | None:
    """Continue a federated run folder from its newest checkpoint (``commgnn federate
    --resume``) with its own ``config.toml``; ``rounds`` extends (or, down to the checkpoint,
    shortens) it. ``data`` is needed again when the run trained on a graph given in Python.
    A run without a checkpoint starts again from round 0 in the same folder."""
    run_dir = Path(run_dir)
    if not is_federated_run(run_dir):
        raise UserError(f"{run_dir} is not a federated run folder (no config.toml with [federated], "
                        f"or a manifest.json of another command)")
    if rounds is not None:
        options = {**options, "rounds": rounds}
    FEDERATE_OPTIONS.check_resume(options)
    cfg = _config(run_dir / "config.toml", {k: v for k, v in options.items() if v is not None})
    old = _config(run_dir / "config.toml", {})
    if cfg.federated.rounds != old.federated.rounds and cfg.dp.enabled and cfg.dp.epsilon > 0:
        raise UserError(f"the DP noise of {run_dir} was calibrated for epsilon {cfg.dp.epsilon:g} over "
                        f"{old.federated.rounds} rounds; its rounds cannot change on resume")
    cfg = replace_path(cfg, "output.out", str(run_dir))
    graph = None
    if isinstance(data, (str, Path)):
        cfg = replace_path(cfg, "data.dataset", str(data))
    else:
        graph = data
    return run_federation(cfg, env=os.environ if env is None else env, graph=graph, resume=True)


def load_federate_result(run_dir: str | Path) -> FederateResult:
    """The result of a finished federated run, read back from its folder."""
    run_dir = Path(run_dir)
    if not (run_dir / "summary.json").is_file():
        raise UserError(f"{run_dir} holds no finished run (no summary.json)")
    curve = []
    if (run_dir / "metrics.jsonl").is_file():
        curve = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return FederateResult(summary=read_json(run_dir / "summary.json"), curve=curve, run_dir=run_dir)
