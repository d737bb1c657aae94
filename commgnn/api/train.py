"""Train from a script or a notebook, get the trained model back.

::

    import commgnn
    result = commgnn.train(data, model="sage", parts=4, epochs=200,
                           comm=commgnn.CommConfig(halo=commgnn.HaloConfig(bits=8)))
    result.model          # the trained torch_geometric module, on CPU (best validation epoch)
    result.summary        # summary.json as a dict
    result.predictions    # [N, C] class scores, in the graph's node order
    result.run_dir        # where the run's records are

This is the same code path as ``commgnn train`` (the CLI builds a :class:`RunConfig` from
its flags and calls :func:`run`): local ranks are spawned, as the CLI does; under
``torchrun`` the same call runs on every rank and rank 0 gets the result (the others get
``None``). Errors raise typed :mod:`commgnn.errors` exceptions: a
:class:`~commgnn.errors.UserError` (bad input) or a :class:`~commgnn.errors.RankFailure`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from torch import Tensor, nn

from commgnn.runner.config import RUN_OPTIONS, RunConfig, resolve_config
from commgnn.runner.own_model import load_own_model, load_weights
from commgnn.runner.launching import train_command
from commgnn.runner.run_dir import default_out_dir
from commgnn.comm.config import CommConfig
from commgnn.config import replace_path
from commgnn.errors import ConfigError, UserError
from commgnn.integrity import load_run_file
from commgnn.models import ModelConfig, ReferenceGNN
from commgnn.report import json_field, read_json

if TYPE_CHECKING:
    from commgnn.api.federate import FederateResult


@dataclass(frozen=True)
class TrainResult:
    """What a training run gives back."""

    model: nn.Module
    """The trained model on CPU, in eval mode: the weights of the best validation epoch in
    a plain PyG module (:class:`~commgnn.models.ReferenceGNN` for the built-in names)."""
    summary: dict[str, Any]
    """``summary.json``: accuracies, bytes, times, memory."""
    predictions: Tensor | None
    """``[N, C]`` float32 class scores (logits) of every node, in the graph's node order;
    None for a run with ``output.predictions = false``."""
    run_dir: Path
    """The run directory (config, manifest, metrics, ``model.pt``, ``predictions.pt``)."""


def train(data: Any = None, *, model: str | nn.Module | None = None, parts: int | None = None,
          comm: CommConfig | None = None,
          config: RunConfig | str | Path | None = None, out: str | Path | None = None,
          env: Mapping[str, str] | None = None, **options: Any) -> TrainResult | None:
    """Train a GNN partition-parallel on ``data`` and return the result.

    Args:
        data: a PyG ``Data``, a dict of tensors (``x``, ``edge_index``, ``y``, optional
            masks), an ``InMemoryDataset`` (its first graph), a dataset name or a ``.pt``
            path; None = the config's dataset (the synthetic graph by default). A graph
            given in Python is recorded as ``data.dataset = "python:<fingerprint>"``; no file
            holds it, so resuming or predicting needs it again.
        model: ``"gcn"``, ``"sage"`` or ``"gat"`` (None: the config's, GCN by default), or
            your own ``nn.Module`` built from PyG
            layers (see :mod:`commgnn.models.byo` for the supported ones), whose forward is
            ``forward(x, edge_index)``. It runs partition-parallel with the halo exchange
            inserted before each message-passing layer; its weights are the starting point
            (your module itself is not changed) and ``result.model`` is a trained copy.
            The run folder records your class by import path (and its constructor
            arguments where your module keeps them as attributes of the same names) and
            its weights as state dicts, never a pickle; see :func:`load_result`.
        parts: number of ranks P (default: the config's, 2).
        comm: communication levers (``CommConfig(halo=HaloConfig(...), grad=...)``).
        config: a :class:`RunConfig`, or a TOML file, to start from.
        out: the run directory (default ``runs/<date>-<dataset>-<model>-p<P>``, with
            ``python`` for a graph given in Python and your class's name for your model).
        env: the environment to look for ``torchrun``'s variables in (default ``os.environ``).
        **options: any ``commgnn train`` flag by its Python name, e.g. ``epochs=200``,
            ``lr=0.01``, ``hidden=128``, ``layers=3``, ``seed=1``, ``quiet=False``.
    """
    module = model if isinstance(model, nn.Module) else None
    if isinstance(model, str):  # with the other options, so that they are checked together
        options = {**options, "model": model}
    elif model is not None and module is None:
        raise ConfigError(f"model= takes a model name or an nn.Module, got {type(model).__name__}")
    cfg = _config(config, options)
    if parts is not None:
        cfg = replace_path(cfg, "runtime.parts", parts)
    if comm is not None:
        if not isinstance(comm, CommConfig):
            raise ConfigError(f"comm= takes a commgnn.CommConfig, got {type(comm).__name__}")
        cfg = replace(cfg, comm=comm)
    graph = None
    if isinstance(data, (str, Path)):
        cfg = replace_path(cfg, "data.dataset", str(data))
    elif data is not None:
        graph = data
    if out is not None:
        cfg = replace_path(cfg, "output.out", str(out))
    return run(cfg, env=os.environ if env is None else env, graph=graph, module=module)


def resume(run_dir: str | Path, data: Any = None, *, epochs: int | None = None,
           env: Mapping[str, str] | None = None,
           model: nn.Module | type | None = None, **options: Any) -> TrainResult | FederateResult | None:
    """Continue a stopped run from its newest checkpoint (``commgnn train --resume``): its own
    config, its own model; ``data`` is needed again when the run trained on a graph given in
    Python; ``epochs`` extends or shortens it.

    A run of your own model rebuilds its class by the import path recorded in the run folder
    (nothing is unpickled; see :mod:`commgnn.runner.own_model`). Pass ``model=`` (the class,
    or an instance) when the class cannot be imported by name (defined in ``__main__`` or a
    notebook) or its constructor arguments were not recorded; the recorded starting weights
    and the checkpoint's replace the instance's.

    ``options``: the run options that may change on resume (``commgnn train --resume``'s
    flags by their Python names, e.g. ``quiet=True``); any other is refused in one line.

    A federated run folder continues as :func:`commgnn.api.federate.resume_federated` says
    (``epochs`` is then its rounds) and gives a :class:`~commgnn.api.federate.FederateResult`."""
    from commgnn.api.federate import is_federated_run, resume_federated  # only a federated folder needs it

    run_dir = Path(run_dir)
    if is_federated_run(run_dir):
        return resume_federated(run_dir, data, rounds=epochs, env=env, **options)
    RUN_OPTIONS.check_resume({**options, "epochs": epochs})
    if not (run_dir / "config.toml").is_file() or not (run_dir / "manifest.json").is_file():
        raise UserError(f"{run_dir} is not a commgnn run directory (no config.toml and manifest.json)")
    flags: dict[str, Any] = {k: v for k, v in {**options, "epochs": epochs}.items() if v is not None}
    cfg = resolve_config(str(run_dir / "config.toml"), {**flags, "out": str(run_dir)}, {})
    graph = None
    if isinstance(data, (str, Path)):
        cfg = replace_path(cfg, "data.dataset", str(data))
    else:
        graph = data
    module = model if isinstance(model, nn.Module) else None
    if model is not None and module is None:  # a class: built from the recorded arguments
        module = load_own_model(run_dir, model, verb=f"commgnn.resume({str(run_dir)!r}, model=MODEL)")
    return run(cfg, env=os.environ if env is None else env, graph=graph, resume=True, module=module)


def run(cfg: RunConfig, *, env: Mapping[str, str], graph: Any = None, resume: bool = False,
        module: nn.Module | None = None) -> TrainResult | None:
    """Train with a resolved configuration (what the CLI calls)."""
    if cfg.output.out is None:
        cfg = replace_path(cfg, "output.out", str(default_out_dir(cfg, graph=graph, module=module)))
    summary = train_command(cfg, env, resume=resume, graph=graph, module=module)
    if summary is None:
        return None  # a torchrun rank other than 0
    return load_result(Path(cfg.output.out), model=module)  # type: ignore[arg-type]


def load_result(run_dir: str | Path, *, model: nn.Module | type | None = None) -> TrainResult:
    """The result of a finished run, read back from its directory (tensors and JSON only).

    A run of your own model rebuilds its class by the import path recorded in the run
    folder; pass ``model=`` (the class, or an instance whose weights are replaced) when it
    cannot be imported by name or its constructor arguments were not recorded (one-line
    :class:`~commgnn.errors.UserError` otherwise; see :mod:`commgnn.runner.own_model`)."""
    run_dir = Path(run_dir)
    if not (run_dir / "summary.json").is_file():
        raise UserError(f"{run_dir} holds no finished run (no summary.json)")
    cfg = resolve_config(str(run_dir / "config.toml"), {}, {})
    manifest = run_dir / "manifest.json"
    # The weights are checked against their sha256 before any class is imported by name.
    state = load_run_file(run_dir, "model.pt")  # tensors only
    module = load_own_model(run_dir, model, verb=f"commgnn.load_result({str(run_dir)!r}, model=MODEL)") \
        or build_model(cfg.model, json_field(manifest, "dataset", "num_features", kind=int),
                       json_field(manifest, "dataset", "num_classes", kind=int))
    load_weights(module, state, run_dir / "model.pt")
    module.eval()
    return TrainResult(model=module, summary=read_json(run_dir / "summary.json"),
                       predictions=load_run_file(run_dir, "predictions.pt")
                       if (run_dir / "predictions.pt").exists() or cfg.output.predictions else None,
                       run_dir=run_dir)


def build_model(cfg: ModelConfig, in_dim: int, num_classes: int) -> nn.Module:
    """The plain single-process PyG module of a built-in model (``model.pt`` fits it)."""
    return ReferenceGNN(cfg, in_dim, num_classes)


def _config(config: RunConfig | str | Path | None, options: Mapping[str, Any]) -> RunConfig:
    """``config`` (a :class:`RunConfig`, a TOML file or None) with the keyword ``options``
    applied: every run option (:data:`~commgnn.runner.config.RUN_OPTIONS`) is one."""
    RUN_OPTIONS.unknown(list(options), "the flags of `commgnn train` by their Python names")
    if isinstance(config, RunConfig):
        return resolve_config(None, dict(options), {}, start=config)
    return resolve_config(str(config) if config is not None else None, dict(options), {})
