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

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from commgnn.config import from_dict, load_checked_toml, replace_path, set_path, to_dict
from commgnn.errors import ConfigError, UserError
from commgnn.federated.config import FederateConfig
from commgnn.report import read_json
from commgnn.runner.federate import default_out_dir, federate_command, is_federated_run

__all__ = ["FederateResult", "federate", "is_federated_run", "load_federate_result", "resume_federated",
           "run_federation"]

SEED_KEYS = ("federated.seed", "split.seed")
"""``seed=`` sets both (as ``--seed`` does)."""

RESUME_OPTIONS = ("rounds", "quiet", "checkpoint_every")
"""What may change when a federated run resumes (the rest is the run's own ``config.toml``)."""


@dataclass(frozen=True)
class FederateResult:
    """What a federated run gives back."""

    summary: dict[str, Any]
    """``summary.json``: test accuracy at the best validation round, worst client, bytes, DP."""
    curve: list[dict[str, Any]]
    """``metrics.jsonl``: one row per evaluation (round, accuracies, bytes so far, ...)."""
    run_dir: Path
    """The run folder."""


def _option_keys() -> dict[str, str]:
    """Each leaf field name of :class:`FederateConfig` -> its dotted key (``epsilon`` ->
    ``dp.epsilon``): the key of that name, or, where several tables have one, the
    ``[federated]`` table's (``rounds`` -> ``federated.rounds``, not ``neighgen.rounds``).
    Names that are ambiguous otherwise (``clip``) are not options."""
    found: dict[str, list[str]] = {}

    def walk(cls: Any, prefix: str) -> None:
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if dataclasses.is_dataclass(default):
                walk(type(default), f"{prefix}{f.name}.")
            else:
                found.setdefault(f.name, []).append(prefix + f.name)

    walk(FederateConfig, "")
    out = {}
    for name, keys in found.items():
        main = [k for k in keys if k.startswith("federated.")]
        if len(keys) == 1 or len(main) == 1:
            out[name] = keys[0] if len(keys) == 1 else main[0]
    return out


def _config(config: FederateConfig | str | Path | None, options: Mapping[str, Any]) -> FederateConfig:
    """``config`` (a config, a TOML file or the defaults) with ``options`` set, checked once."""
    keys = _option_keys()
    unknown = sorted(set(options) - set(keys) - {"seed"})
    if unknown:
        raise ConfigError(f"unknown option {unknown[0]!r}; options are the field names of FederateConfig "
                          f"({', '.join(sorted(keys))}) and seed; start from a FederateConfig or a TOML file "
                          f"for the others")
    if isinstance(config, FederateConfig):
        data = to_dict(config)
    elif config is not None:
        data = load_checked_toml(FederateConfig, str(config))
    else:
        data = {}
    for name, value in options.items():
        for key in SEED_KEYS if name == "seed" else (keys[name],):
            set_path(data, key, value)
    return from_dict(FederateConfig, data)


def federate(data: Any = None, *, config: FederateConfig | str | Path | None = None, out: str | Path | None = None,
             env: Mapping[str, str] | None = None, **options: Any) -> FederateResult | None:
    """Train a federation on ``data`` and return the result.

    Args:
        data: a PyG ``Data``, a dict of tensors, an ``InMemoryDataset``, a dataset name or a
            ``.pt`` path; None = the config's dataset.
        config: a :class:`FederateConfig`, or a TOML file, to start from.
        out: the run folder (default ``runs/federate-<dataset>-<algorithm>-<time>``).
        env: where to look for ``torchrun``'s variables (default ``os.environ``).
        **options: a field of :class:`FederateConfig` by its name (``[federated]``'s where
            tables share one), e.g.
            ``clients=5``, ``rounds=100``, ``participation=0.5``, ``epsilon=4.0``,
            ``parts=3``, ``checkpoint_every=10``, ``quiet=True``; ``seed`` sets the split's
            and the training's seed.
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
    other = sorted(set(options) - set(RESUME_OPTIONS))
    if other:
        raise UserError(f"--resume continues the run as its config.toml says; only {', '.join(RESUME_OPTIONS)} "
                        f"may change, not {other[0]}")
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
