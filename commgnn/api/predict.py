"""Distributed inference with a trained run's model (``commgnn predict RUN_DIR``).

::

    import commgnn
    scores = commgnn.predict("runs/my-run")                  # the run's own graph
    scores = commgnn.predict("runs/my-run", data)            # a graph given in Python
    scores = commgnn.predict("runs/my-run", model=MyModel)   # your model, defined in __main__
    scores = commgnn.predict("runs/my-run", nodes="test")    # [k, C]: one split's nodes only

The run's own graph is predicted on from the run's own partition directory when it is
there for the same rank count (no graph is loaded: a graph folder's run predicts as it
trained, each rank reading its own folder); another graph (with the same feature width
and classes), or another rank count, is partitioned as the run was. P ranks load
``model.pt`` and run one exact eval-mode forward (the exact halo exchange, whatever levers
trained the model; a mini-batch run's model layer by layer where its evaluation would be,
``minibatch.inference``), and the ``[N, C]`` class scores come back in the graph's node order. It uses the same launcher, watchdog and
one-line errors as training.

Every run that ``train`` can produce predicts:

* **a built-in model**: rebuilt from ``config.toml``;
* **your own model**: its class is imported by the name recorded in the run folder and built
  from its recorded constructor arguments; nothing is unpickled from the folder
  (:mod:`commgnn.runner.own_model`), only after ``model.pt`` passed its hash check and
  never from a file inside the run folder or the current directory. Pass ``model=`` (the
  class, or an instance) when the class cannot be imported by name (``__main__``, a
  notebook, a module the run folder ships) or its arguments were not recorded; each such
  case is refused in one line that says so;
* **a graph given in Python**: no file holds it, so ``data`` must be given again (refused in
  one line otherwise, never silently replaced by another graph).

``nodes`` scores chosen nodes only: a split's name or global ids. A run predicted layer by
layer then computes each layer only on the rows the next one needs (the targets' receptive
field, :func:`~commgnn.trainers.layerwise.receptive_rows`), so a graph whose ``[N, C]``
scores would not fit in memory, or whose every row's layer outputs would take hours,
still predicts its test split; without ``nodes`` such a job is refused in one line before
any rank starts.

A rank that fails leaves its log where the error says: the logs' folder is removed only
after a successful prediction.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from commgnn.comm.config import CommConfig
from commgnn.data import GIVEN_GRAPH, fingerprint, load_dataset
from commgnn.distributed.context import LaunchInfo, free_port, init_distributed, shutdown
from commgnn.distributed.events import Hooks
from commgnn.distributed.forkserver import prestart
from commgnn.distributed.memory import available_bytes
from commgnn.distributed.spawn import spawn_ranks
from commgnn.integrity import load_run_file, save_tensors
from commgnn.errors import DataError, UserError
from commgnn.partition import assign_parts, build_local_partitions, load_partition, save_partitions
from commgnn.report import json_field
from commgnn.runner.config import RunConfig, resolve_config
from commgnn.runner.folder_graph import check_folder, graph_folder, method_for_folder, parts_for_folder, \
    write_folder_partitions
from commgnn.runner.own_model import carry_model, load_own_model, load_weights, unpack_model
from commgnn.runner.preflight import check_rank_count
from commgnn.runner.rank import gather_chosen, gather_rows
from commgnn.runner.run_dir import is_given_graph
from commgnn.trainers import FullGraphTrainer
from commgnn.trainers.layerwise import LayerwiseInference
from commgnn.trainers.mb_setup import available_memory, inference_mode, owner_map


SPLITS = {"train": "train_mask", "val": "val_mask", "valid": "val_mask", "test": "test_mask"}
"""The split names ``nodes`` takes and the partition mask each reads."""


def predict(run_dir: str | Path, data: Any = None, *, model: nn.Module | type | None = None,
            parts: int | None = None, out: str | Path | None = None,
            data_root: str | None = None, nodes: Any = None) -> torch.Tensor:
    """``[N, C]`` float32 class scores of every node of the run's graph (or of ``data``);
    with ``nodes``, ``[k, C]`` those of the k nodes chosen.

    Args:
        run_dir: a finished run directory (``model.pt``, ``config.toml``, ``manifest.json``).
        data: None for the run's own graph; a dataset name or ``.pt`` path; or a PyG ``Data``,
            a dict of tensors or an ``InMemoryDataset``. Needed again for a run that trained
            on a graph given in Python. Its feature width and classes must be the run's.
        model: for a run of your own model whose class cannot be imported by name or
            built from recorded arguments: the class, or an instance (its weights are
            replaced by ``model.pt``).
        parts: ranks P (default: the run's).
        out: also save the scores there (``torch.save``; written whole, then renamed); with
            ``nodes``, the dict ``{"nodes": [k] int64 ids, "scores": [k, C], "receptive_rows":
            [L + 1]}``, the last the rows each layer computed (layer 0: the feature rows
            read), summed over the ranks.
        data_root: folder with staged datasets, for a dataset ``data`` names.
        nodes: None for every node; a split's name (``"train"``, ``"val"``, ``"test"``: its
            nodes in ascending id order); or global node ids (a sequence, a 1-D integer
            tensor or array, or the path of a ``.npy`` file holding one), scored in the
            order given.

    Raises :class:`~commgnn.errors.UserError` (one line) for bad input and
    :class:`~commgnn.errors.RankFailure` naming an existing log when a rank fails.
    """
    run_dir = Path(run_dir)
    for name in ("model.pt", "config.toml", "manifest.json"):
        if not (run_dir / name).is_file():
            raise UserError(f"{run_dir} holds no trained model (no {name}); train it first")
    cfg = resolve_config(str(run_dir / "config.toml"), {}, {})
    trained = json_field(run_dir / "manifest.json", "dataset", kind=dict)
    graph = None
    if isinstance(data, (str, Path)):
        cfg = replace(cfg, data=replace(cfg.data, dataset=str(data), root=data_root or cfg.data.root))
    elif data is not None:
        graph = data
    elif is_given_graph(cfg) or trained.get("name") == GIVEN_GRAPH:
        raise UserError(f"{run_dir} trained on a graph given in Python, which no file holds; pass it again: "
                        f"commgnn.predict({str(run_dir)!r}, data) (or `commgnn predict --dataset FILE.pt`)")
    # The weights are checked against their sha256 before any class is imported by name.
    state = load_run_file(run_dir, "model.pt")  # sha256-checked, tensors only
    if not isinstance(state, dict):
        raise UserError(f"{run_dir / 'model.pt'} does not hold a state dict")
    module = load_own_model(run_dir, model, verb=f"commgnn.predict({str(run_dir)!r}, model=MODEL)")
    own_parts = _own_partitions(run_dir, cfg, parts) if data is None else None
    if parts is not None:
        cfg = replace(cfg, runtime=replace(cfg.runtime, parts=parts))
    cfg = replace(cfg, partition=replace(cfg.partition, dir=None))
    P = cfg.runtime.parts
    check_rank_count(P, force=cfg.runtime.force)
    chosen = _chosen(nodes)
    if module is not None:  # the weights must fit before any rank starts
        load_weights(module, state, run_dir / "model.pt")
    work = Path(tempfile.mkdtemp(prefix="commgnn-predict-"))
    logs = Path(tempfile.mkdtemp(prefix="commgnn-predict-logs-"))
    target = Path(out) if out is not None else work / "scores.pt"
    ok = False
    try:
        if own_parts is not None:  # the run's own partitions: no graph is loaded (each rank checks its files)
            part_dir, fp = own_parts, str(trained.get("fingerprint"))
        else:
            part_dir, fp = str(work / "partitions"), _partition_for_predict(cfg, graph, trained, work / "partitions")
        N, C = (json_field(Path(part_dir) / "meta.json", key, kind=int) for key in ("num_nodes", "num_classes"))
        if isinstance(chosen, torch.Tensor):
            _check_ids(chosen, N)
        if chosen is None:
            _check_scores_fit(N, C)
        ids, back = (torch.unique(chosen, return_inverse=True) if isinstance(chosen, torch.Tensor)
                     else (chosen, None))
        args = (cfg, part_dir, fp, state, str(target), carry_model(module, P), ids)
        if P == 1:
            _predict_rank(LaunchInfo(rank=0, world_size=1, local_rank=0, local_world_size=1,
                                     master_addr=cfg.runtime.master_addr, port=0), *args)
        else:
            cuda = None if cfg.runtime.device == "auto" else cfg.runtime.device == "cuda"
            prestart(cuda=torch.cuda.is_available() if cuda is None else cuda)
            spawn_ranks(_predict_rank, args, nprocs=P, master_addr=cfg.runtime.master_addr,
                        port=free_port(cfg.runtime.master_addr), log_dir=str(logs),
                        heartbeat_s=cfg.runtime.heartbeat_timeout_s, cuda=cuda)
        scores = torch.load(target, map_location="cpu", weights_only=True)
        if back is not None:  # the order given, repeats included
            scores = {**scores, "nodes": chosen, "scores": scores["scores"][back]}
            if out is not None:
                save_tensors(scores, target)
        if isinstance(scores, dict):
            scores = scores["scores"]
        ok = True
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if ok:  # a failed rank's log stays where its error points
            shutil.rmtree(logs, ignore_errors=True)
    return scores


def _chosen(nodes: Any) -> str | torch.Tensor | None:
    """``nodes`` as a split's name or a 1-D int64 tensor of ids (unchecked against N yet)."""
    if nodes is None:
        return None
    if isinstance(nodes, str) and nodes in SPLITS:
        return "val" if nodes == "valid" else nodes
    if isinstance(nodes, (str, Path)):
        path = Path(nodes)
        if path.suffix != ".npy":
            raise UserError(f"nodes = {str(nodes)!r}: give a split (train, val, test) or a .npy file of node ids")
        try:
            nodes = np.load(path, allow_pickle=False)  # an array, never an object
        except (OSError, ValueError) as e:
            raise DataError(f"{path}: not a readable .npy array of node ids ({e})") from None
    try:
        ids = torch.as_tensor(np.asarray(nodes))
    except (TypeError, ValueError, RuntimeError) as e:
        raise UserError(f"nodes: not a sequence of node ids ({e})") from None
    if ids.dim() != 1 or ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise DataError(f"nodes: expected a 1-D array of integer node ids, got shape {tuple(ids.shape)} "
                        f"of {ids.dtype}")
    if ids.numel() == 0:
        raise UserError("nodes: no node ids given")
    return ids.to(torch.int64)


def _check_ids(ids: torch.Tensor, num_nodes: int) -> None:
    bad = ((ids < 0) | (ids >= num_nodes)).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        raise DataError(f"nodes: id {int(ids[i])} (entry {i}) is outside the graph's {num_nodes} nodes")


SCORES_SHARE = 0.8
"""The largest fraction of available memory the ``[N, C]`` float32 scores of every node may
take on the launching host (rank 0 assembles them there) before ``predict`` without
``nodes`` is refused."""


def _check_scores_fit(num_nodes: int, classes: int) -> None:
    need, avail = 4.0 * num_nodes * classes, available_bytes()
    if need > SCORES_SHARE * avail:
        raise UserError(f"the scores of all {num_nodes:,} nodes x {classes} classes take {need / 1e9:.1f} GB, more "
                        f"than this host can hold ({avail / 1e9:.1f} GB available); predict chosen nodes: "
                        f"--nodes test (or train, val, or a .npy file of node ids)")


def _own_partitions(run_dir: Path, cfg: RunConfig, parts: int | None) -> str | None:
    """The run's own partition directory (its ``partitions/`` or the ``partition.dir`` it
    trained from) when it is there for the same rank count; None otherwise."""
    if parts is not None and parts != cfg.runtime.parts:
        return None
    pdir = Path(cfg.partition.dir) if cfg.partition.dir else run_dir / "partitions"
    return str(pdir) if (pdir / "meta.json").is_file() else None


def _check_shape(trained: dict[str, Any], features: int, classes: int) -> None:
    if (features, classes) != (trained.get("num_features"), trained.get("num_classes")):
        raise DataError(f"the model was trained on {trained.get('num_features')} features and "
                        f"{trained.get('num_classes')} classes; this graph has {features} and {classes}")


def _partition_for_predict(cfg: RunConfig, graph: Any, trained: dict[str, Any], dest: Path) -> str:
    """Partition the graph to predict on into ``dest`` as the run was partitioned (a graph
    folder out of core, :mod:`commgnn.runner.folder_graph`); its fingerprint."""
    folder = graph_folder(cfg, graph)
    if folder is not None:
        _check_shape(trained, folder.num_features, folder.num_classes)
        fp, _ = check_folder(cfg, folder)
        cfg = method_for_folder(cfg, folder)
        write_folder_partitions(folder, parts_for_folder(cfg, folder, dest), cfg.runtime.parts, dest,
                                {"graph_fingerprint": fp}, features=cfg.partition.features)
        return fp
    loaded = load_dataset(cfg.data, graph)
    _check_shape(trained, int(loaded.x.shape[1]), int(loaded.num_classes_total))
    fp = fingerprint(loaded)
    parts_of = assign_parts(loaded.edge_index, loaded.num_nodes, cfg.runtime.parts, cfg.partition)
    save_partitions(dest, build_local_partitions(loaded, parts_of, cfg.runtime.parts), {"graph_fingerprint": fp})
    return fp


def _predict_rank(info: LaunchInfo, cfg: RunConfig, part_dir: str, fp: str, state: dict[str, Any],
                  out: str, packed: bytes | nn.Module | None, chosen: str | torch.Tensor | None = None) -> None:
    ctx = init_distributed(info, cfg.runtime)
    part = load_partition(part_dir, ctx.rank, expected_fingerprint=fp, expected_parts=ctx.world_size)
    hooks = Hooks()
    # Only the halo settings shape the model (precompute, transform-first); evaluation is exact.
    mode = "full"
    if cfg.train.mode == "minibatch" and packed is None:  # as its evaluation ran: layer by layer where needed
        mode = inference_mode(ctx, cfg.minibatch, part.to("cpu"), cfg.model, 8 if cfg.train.dtype == "float64" else 4,
                              available_memory(ctx))
    trainer = FullGraphTrainer(ctx, part, cfg.model, cfg.train, hooks, comm_cfg=CommConfig(halo=cfg.comm.halo),
                               module=unpack_model(packed), half_input=mode in ("layerwise", "sampled"))
    if mode in ("layerwise", "sampled"):  # a run evaluated by sampling is still predicted exactly
        owner, row = owner_map(ctx, hooks, trainer.part.to("cpu"))
        trainer.layerwise = LayerwiseInference(ctx, hooks, trainer.model, trainer.part, trainer.x, owner, row,
                                               cfg.minibatch.inference_chunk)
    if chosen is None:
        scores = gather_rows(ctx, hooks, trainer, part, trainer.predict(state))
        if ctx.is_main:
            save_tensors(scores.cpu(), out)  # written whole (fsync), then renamed into place
        shutdown(ctx)
        return
    own = part.global_ids.cpu()
    rows = (getattr(part, SPLITS[chosen]).cpu() if isinstance(chosen, str) else torch.isin(own, chosen)).nonzero().flatten()
    ids, scores = gather_chosen(ctx, hooks, own[rows], trainer.predict(state, rows=rows))
    field = trainer.layerwise.stats.get("receptive_rows") if isinstance(trainer.layerwise, LayerwiseInference) else None
    reach = torch.tensor(field if field is not None else [part.num_owned] * (cfg.model.layers + 1),
                         dtype=torch.float64)
    reach = ctx.all_reduce(reach) if ctx.is_distributed else reach  # every layer's rows, summed over ranks
    if ctx.is_main:  # a split in ascending id order; given ids in the order of ``chosen`` (sorted, unique)
        order = torch.sort(ids).indices
        save_tensors({"nodes": ids[order], "scores": scores[order], "receptive_rows": reach.to(torch.int64)}, out)
    shutdown(ctx)
