"""``commgnn predict RUN_DIR``: distributed inference with a trained run's model.

The graph (the run's own, or another one with the same feature width and classes, given
by ``--dataset``) is partitioned as the run was, P ranks load ``model.pt`` and run one
exact eval-mode forward (the exact halo exchange, whatever levers trained the model), and
the ``[N, C]`` class scores are written in the graph's node order. It uses the same
launcher, watchdog and one-line errors as training.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from commgnn.runner.config import RunConfig, resolve_config
from commgnn.runner.preflight import check_rank_count
from commgnn.runner.rank import gather_rows
from commgnn.comm.config import CommConfig
from commgnn.data import fingerprint, load_dataset
from commgnn.distributed.context import LaunchInfo, free_port, init_distributed, shutdown
from commgnn.distributed.events import Hooks
from commgnn.distributed.spawn import spawn_ranks
from commgnn.errors import DataError, UserError
from commgnn.integrity import load_run_file
from commgnn.partition import build_local_partitions, load_partition, partition_graph, save_partitions
from commgnn.report import read_json
from commgnn.trainers import FullGraphTrainer


def predict(run_dir: Path, *, out: Path, dataset: str | None = None, data_root: str | None = None,
            parts: int | None = None) -> torch.Tensor:
    """Scores ``[N, C]`` of every node of the run's graph (or ``dataset``), saved to ``out``."""
    run_dir = Path(run_dir)
    if not (run_dir / "model.pt").is_file() or not (run_dir / "config.toml").is_file():
        raise UserError(f"{run_dir} holds no trained model (model.pt and config.toml); train it first")
    cfg = resolve_config(str(run_dir / "config.toml"), {}, {})
    if dataset is not None:
        cfg = replace(cfg, data=replace(cfg.data, dataset=dataset, root=data_root or cfg.data.root))
    if parts is not None:
        cfg = replace(cfg, runtime=replace(cfg.runtime, parts=parts))
    cfg = replace(cfg, partition=replace(cfg.partition, dir=None))
    P = cfg.runtime.parts
    check_rank_count(P, force=cfg.runtime.force)
    state = load_run_file(run_dir, "model.pt")  # sha256-checked, tensors only
    data = load_dataset(cfg.data)
    trained = read_json(run_dir / "manifest.json")["dataset"]
    if (int(data.x.shape[1]), int(data.num_classes_total)) != (trained["num_features"], trained["num_classes"]):
        raise DataError(f"the model was trained on {trained['num_features']} features and "
                        f"{trained['num_classes']} classes; this graph has {data.x.shape[1]} and "
                        f"{data.num_classes_total}")
    fp = fingerprint(data)
    parts_of = partition_graph(data.edge_index, data.num_nodes, P, cfg.partition)
    tmp = Path(tempfile.mkdtemp(prefix="commgnn-predict-"))
    try:
        save_partitions(tmp, build_local_partitions(data, parts_of, P), {"graph_fingerprint": fp})
        del data, parts_of
        args = (cfg, str(tmp), fp, state, str(out))
        if P == 1:
            _predict_rank(LaunchInfo(rank=0, world_size=1, local_rank=0, local_world_size=1,
                                     master_addr=cfg.runtime.master_addr, port=0), *args)
        else:
            spawn_ranks(_predict_rank, args, nprocs=P, master_addr=cfg.runtime.master_addr,
                        port=free_port(cfg.runtime.master_addr), log_dir=str(tmp),
                        heartbeat_s=cfg.runtime.heartbeat_timeout_s)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return torch.load(out, weights_only=True)


def _predict_rank(info: LaunchInfo, cfg: RunConfig, part_dir: str, fp: str, state: dict[str, Any],
                  out: str) -> None:
    ctx = init_distributed(info, cfg.runtime)
    part = load_partition(part_dir, ctx.rank, expected_fingerprint=fp, expected_parts=ctx.world_size)
    hooks = Hooks()
    # Only the halo settings shape the model (precompute, transform-first); evaluation is exact.
    trainer = FullGraphTrainer(ctx, part, cfg.model, cfg.train, hooks, comm_cfg=CommConfig(halo=cfg.comm.halo))
    scores = gather_rows(ctx, hooks, trainer, part, trainer.predict(state))
    if ctx.is_main:
        tmp = Path(out).with_suffix(".tmp")
        torch.save(scores.cpu(), tmp)
        tmp.replace(out)
    shutdown(ctx)
