"""One rank's part of ``commgnn train``: train, log, checkpoint, resume, summarise.

Both launch paths (our local launcher and ``torchrun``) call :func:`run_rank` on every rank
with the rank's partition. Rank 0 writes ``metrics.jsonl`` and, when every rank is done,
``summary.json``, the trained weights ``model.pt`` and ``predictions.pt``; every rank
writes its share of each checkpoint.

Resume: with ``resume=True`` every rank loads its state from the run directory's newest
complete checkpoint (:mod:`commgnn.trainers.checkpoint`) and rank 0 cuts ``metrics.jsonl``
back to that epoch, so a resumed run logs every epoch exactly once and ends with the same
records as an uninterrupted one. Without a checkpoint the run starts again from epoch 0.
"""

from __future__ import annotations

import gc
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from commgnn.runner.config import RunConfig
from commgnn.distributed.context import DistContext
from commgnn.distributed.events import Hooks
from commgnn.distributed.faults import FaultInjector
from commgnn.errors import UserError
from commgnn.integrity import save_run_file
from commgnn.metrics import Meter
from commgnn.metrics.energy import EnergyMeter, energy_summary
from commgnn.models.byo import message_passing_layers
from commgnn.partition import LocalPartition
from commgnn.partition.reorder import reorder_for_locality
from commgnn.report import EpochProgress, MetricsLog, print_summary, summarise, write_json
from commgnn.report.records import dumps_standard
from commgnn.trainers import FullGraphTrainer
from commgnn.trainers.minibatch import MiniBatchTrainer
from commgnn.trainers import checkpoint
from commgnn.trainers.solo import alone_summary, compute_alone


def _logged_rows(path: Path, upto: int) -> list[dict[str, Any]]:
    """Rows of ``metrics.jsonl`` up to epoch ``upto``; the file is rewritten to hold just them
    (a torn last line of a killed run is dropped with the rest)."""
    rows: list[dict[str, Any]] = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                break
            if row.get("epoch", upto + 1) > upto:
                break
            rows.append(row)
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(dumps_standard(r) + "\n" for r in rows))  # an older run's bare NaN: null
    tmp.replace(path)
    return rows


@contextmanager
def frozen_heap(enabled: bool) -> Iterator[None]:
    """While open (``enabled``), the objects alive at its start are out of the garbage
    collector's scans (``gc.freeze``), so a full collection costs what the block allocated
    (``RuntimeConfig.gc_freeze``); on leaving, they are handed back (``gc.unfreeze``). Cyclic
    garbage among them waits for the hand-back (no collection first: it would stall every
    rank at once, the thing this avoids). A process that holds frozen objects already (a
    user's pre-forking server calling ``commgnn.train`` with ``parts=1``, or a torchrun
    script) is left as it is: ``gc.unfreeze`` would hand back the user's objects too."""
    if not enabled or gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _resume(ctx: DistContext, trainer: FullGraphTrainer, meter: Meter, out: Path,
            fingerprint: str) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Load the newest checkpoint into ``trainer`` and ``meter``; rank 0's logged rows so
    far, and the best weights so far."""
    meta = checkpoint.latest(out)
    epoch, best = 0, None
    if meta is not None:
        state = checkpoint.load_rank(out, meta, ctx.rank, parts=ctx.world_size, fingerprint=fingerprint)
        trainer.load_state_dict(state["trainer"])
        meter.load_state_dict(state["meter"])
        epoch, best = meta["epoch"], state.get("best")
    return (_logged_rows(out / "metrics.jsonl", epoch) if ctx.is_main else []), best


def run_rank(ctx: DistContext, cfg: RunConfig, part: LocalPartition, out: Path, report: dict[str, Any], *,
             fingerprint: str, resume: bool = False, attempt: int = 0, module: nn.Module | None = None) -> None:
    """Train on this rank's partition (all ranks call it together); ``module``: the user's
    own PyG model instead of the built-in ``cfg.model``."""
    energy = EnergyMeter(cfg.energy)
    energy.start()  # first: CodeCarbon's hardware probe takes seconds (in its own thread)
    hooks = Hooks()
    meter = Meter(ctx, len(message_passing_layers(module)) if module is not None else cfg.model.layers)
    hooks.subscribe(meter)
    trainer: FullGraphTrainer
    if cfg.train.mode != "minibatch":  # mini-batch sampling needs ascending ids (the config refuses a reorder)
        # Once, before the model's operators are built; every later use of owned rows
        # (evaluation, predictions.pt, checkpoints) goes through part.global_ids or the trainer.
        part = reorder_for_locality(part, cfg.partition.reorder)
    if cfg.train.mode == "minibatch":
        trainer = MiniBatchTrainer(ctx, part, cfg.model, cfg.train, hooks, sampler_cfg=cfg.minibatch,
                                   fetch_cfg=cfg.fetch, comm_cfg=cfg.comm)
    else:
        trainer = FullGraphTrainer(ctx, part, cfg.model, cfg.train, hooks, comm_cfg=cfg.comm, module=module)
    meter.end_setup()  # set-up traffic is reported apart from the epochs
    if cfg.fault is not None:
        trainer.on_phase = FaultInjector(cfg.fault, ctx.rank, attempt)
        trainer.on_phase("startup", 0)
    rows, best = _resume(ctx, trainer, meter, out, fingerprint) if resume else ([], None)
    if ctx.watchdog is not None:
        ctx.watchdog.arm()  # set-up is over on every rank: heartbeats are judged from now on
    log = MetricsLog(out / "metrics.jsonl") if ctx.is_main else None
    show = ctx.is_main and not cfg.output.quiet
    every = cfg.runtime.checkpoint_every
    try:
        with frozen_heap(cfg.runtime.gc_freeze), EpochProgress(cfg.train.epochs, enabled=show) as progress:
            if trainer.epoch:
                progress.skip(trainer.epoch)
            for res in trainer.run():
                traffic = meter.end_epoch(res.time_s)
                row = {"epoch": res.epoch, "loss": res.loss, "train_acc": res.train_acc,
                       "val_acc": res.val_acc, "test_acc": res.test_acc, **traffic.to_dict(),
                       **trainer.epoch_log()}
                if res.consensus is not None:
                    row["consensus_distance"] = res.consensus
                rows.append(row)
                if best is None or res.val_acc > best["val_acc"]:  # summarise's best epoch
                    best = {"val_acc": res.val_acc, "epoch": res.epoch, "state": trainer.evaluated_state()}
                if log:
                    if not out.is_dir():
                        raise UserError(f"run directory {out} was removed during the run")
                    log.write(row)
                progress.update(row)
                if every and res.epoch % every == 0:
                    _checkpoint(ctx, trainer, meter, out, fingerprint, best)
    finally:
        if log:
            log.close()
    readings = _gather_energy(ctx, energy.stop())
    assert best is not None  # run() yields at least one epoch (epochs > 0)
    alone = None
    if cfg.runtime.compute_alone and not isinstance(trainer, MiniBatchTrainer):
        alone = compute_alone(trainer)
    _export(ctx, trainer, hooks, part, out, best["state"], cfg.output.embeddings_layer, cfg.output.predictions)
    totals = meter.totals()
    if log:
        name = type(module).__name__ if module is not None else cfg.model.name
        summary = summarise(dataset=cfg.data.dataset, model=name, parts=ctx.world_size,
                            rows=rows, totals=totals, partition=report)
        summary.update(energy_summary(readings, summary["total_bytes"], cfg.energy, len(rows)))
        summary.update(_how_it_ended(ctx, cfg, trainer))
        if alone is not None:
            summary.update(alone_summary(alone, rows))
        write_json(out / "summary.json", summary)
        if show:
            print_summary(summary, str(out))


def _how_it_ended(ctx: DistContext, cfg: RunConfig, trainer: FullGraphTrainer) -> dict[str, Any]:
    """``summary.json``'s ``epochs_planned``, ``stopped_early`` (``{"reason": "patience",
    "patience", "epoch"}`` when no better validation accuracy for ``train.patience`` epochs
    ended training before ``train.epochs``; else None) and ``one_host`` (every rank on this
    machine, so the network's bytes crossed loopback, not a wire)."""
    patience = cfg.train.patience
    early = bool(patience) and trainer.epoch < cfg.train.epochs and getattr(trainer, "since_best", 0) >= patience
    return {"epochs_planned": cfg.train.epochs,
            "stopped_early": {"reason": "patience", "patience": patience, "epoch": trainer.epoch} if early else None,
            "one_host": ctx.local_world_size == ctx.world_size}


_ENERGY_KEYS = ("cpu_kwh", "ram_kwh", "co2_g", "kg_per_kwh", "measured_s")


def _gather_energy(ctx: DistContext, mine: dict[str, Any] | None) -> list[dict[str, Any] | None]:
    """Every rank's energy reading (None where it was not measured); the method is rank 0's."""
    vec = torch.tensor([float(mine is not None), *((mine or {}).get(k, 0.0) for k in _ENERGY_KEYS)],
                       dtype=torch.float64)
    got = ctx.all_gather(vec)
    method = (mine or {}).get("cpu_method", "")
    return [dict(zip(_ENERGY_KEYS, row[1:].tolist()), cpu_method=method) if row[0] else None for row in got]


def _export(ctx: DistContext, trainer: FullGraphTrainer, hooks: Hooks, part: LocalPartition, out: Path,
            state: dict[str, Any], embeddings_layer: int | None, predictions: bool = True) -> None:
    """Rank 0 writes ``model.pt`` (the weights of the best validation epoch, the state dict
    of the same model in plain PyG), ``predictions.pt`` (``[N, C]`` float32 class scores,
    logits of an exact eval-mode pass, in the graph's own node order; unless
    ``output.predictions`` is false) and, if asked, ``embeddings.pt`` (``[N, d]``, the
    output of one layer)."""
    if predictions:
        scores = gather_rows(ctx, hooks, trainer, part, trainer.predict(state))
    if embeddings_layer is not None:
        emb = gather_rows(ctx, hooks, trainer, part, trainer.predict(state, layer=embeddings_layer))
    if ctx.is_main:
        save_run_file(state, out, "model.pt")  # each hashed into hashes.json (commgnn.integrity)
        if predictions:
            save_run_file(scores, out, "predictions.pt")
        if embeddings_layer is not None:
            save_run_file(emb, out, "embeddings.pt")


def gather_rows(ctx: DistContext, hooks: Hooks, trainer: FullGraphTrainer, part: LocalPartition,
                rows: torch.Tensor) -> torch.Tensor:
    """``[N, d]`` float32 on rank 0, in global node order, from each rank's ``[n_own, d]``
    rows (``[0, d]`` on the other ranks): each rank sends its ids and rows to rank 0 point to
    point, one rank after another, and rank 0 scatters them in, so it holds the result and
    one rank's rows, and the others their own (an all-reduce of a zero-filled ``[N, d]``
    held that on every rank and moved ``2 (P - 1) / P`` of it: 1.9 GB a rank and 11.3 GB
    in all for the 10M-node graph's scores). Counted as control traffic."""
    d = int(rows.shape[1])
    rows = rows.detach().float().cpu()
    ids = trainer.part.global_ids.cpu()
    if not ctx.is_main:
        ctx.send(torch.tensor([ids.numel()], dtype=torch.int64), 0)
        ctx.send(ids, 0)
        ctx.send(rows, 0)
        hooks.sent("control", -1, 0, 8 + ids.numel() * 8 + rows.numel() * 4)
        return rows.new_zeros((0, d))
    full = torch.zeros(part.num_nodes_global, d, dtype=torch.float32)
    full[ids] = rows
    del rows
    for r in range(1, ctx.world_size):
        n = int(ctx.recv(torch.zeros(1, dtype=torch.int64), r)[0])
        their_ids = ctx.recv(torch.empty(n, dtype=torch.int64), r)
        full[their_ids] = ctx.recv(torch.empty(n, d, dtype=torch.float32), r)
    return full


def gather_chosen(ctx: DistContext, hooks: Hooks, ids: torch.Tensor,
                  rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's chosen nodes ``ids [m_r]`` and their ``rows [m_r, d]`` on rank 0,
    concatenated in rank order (float32; empty on the other ranks), sent point to point as
    :func:`gather_rows` does. Counted as control traffic."""
    d = int(rows.shape[1])
    rows, ids = rows.detach().float().cpu(), ids.to(torch.int64).cpu()
    if not ctx.is_main:
        ctx.send(torch.tensor([ids.numel()], dtype=torch.int64), 0)
        if ids.numel():  # a rank that chose none sends its count alone
            ctx.send(ids, 0)
            ctx.send(rows, 0)
        hooks.sent("control", -1, 0, 8 + ids.numel() * 8 + rows.numel() * 4)
        return ids[:0], rows[:0]
    all_ids, all_rows = [ids], [rows]
    for r in range(1, ctx.world_size):
        n = int(ctx.recv(torch.zeros(1, dtype=torch.int64), r)[0])
        if n:
            all_ids.append(ctx.recv(torch.empty(n, dtype=torch.int64), r))
            all_rows.append(ctx.recv(torch.empty(n, d, dtype=torch.float32), r))
    return torch.cat(all_ids), torch.cat(all_rows)


def _checkpoint(ctx: DistContext, trainer: FullGraphTrainer, meter: Meter, out: Path, fingerprint: str,
                best: dict[str, Any] | None) -> None:
    """Every rank saves, a barrier confirms all did, then rank 0 commits the set."""
    state = {"epoch": trainer.epoch, "trainer": trainer.state_dict(), "meter": meter.state_dict(),
             "best": best}
    sha = checkpoint.save_rank(out, trainer.epoch, ctx.rank, state)
    # every rank's hash for the set's manifest; the gather is also the barrier that confirms all saved
    hashes = checkpoint.gather_hashes(ctx, sha)
    if ctx.is_main:
        checkpoint.commit(out, trainer.epoch, ctx.world_size, fingerprint, hashes)
