"""Each rank's compute alone: the ranks run one training step's work one at a time.

The ranks of a local run (and of the emulated cluster) share this machine's cores, which no
real cluster does, so the compute a run records is inflated by its neighbours. After
training, :func:`compute_alone` measures every rank's forward and backward pass with the
machine to itself: rank 0, 1, ... in turn, each while the others wait at a barrier, runs
one untimed step and then ``repeats`` timed ones through an exchange that communicates
nothing and returns zero rows of the shape the real one would, and takes the median.
Written by hand.

The built-in models' kernels take the same time whatever the values (zeros are no
denormals); a user's own model with value-dependent steps (``nonzero``, ``unique``) could
differ. No received block is recorded or replayed: each exchange returns fresh zeros of the
shape it would receive, so the measurement keeps no layer's received blocks beyond the
step that uses them (the memory results page says what replaying them once cost).

What it measures is the exact model's training forward and backward and its evaluation
forward (what every lever's compute is built on; every epoch evaluates, so leaving the
evaluation out would count it as contention in the shared/alone ratio); a lever's encode
and decode, the optimiser step and the gradient sync are not in it. The
model's gradients are cleared and its mode restored afterwards, so training is unaffected.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from commgnn.comm.halo.alltoall import AllToAllHalo
from commgnn.comm.halo.exchange import RowExchange, Wrapper
from commgnn.distributed.events import Hooks
from commgnn.trainers.fullgraph import FullGraphTrainer, halo_plan


class _Silent(Wrapper):
    """Returns zeros shaped as the wrapped exchange's result, ``[sum(in_counts), *rows.shape[1:]]``
    (as :class:`AllToAllHalo` returns), instead of communicating."""

    def move(self, rows: Tensor, out_counts: list[int], in_counts: list[int], layer: int, kind: str) -> Tensor:
        return rows.new_zeros((sum(in_counts), *rows.shape[1:]))


def _step(trainer: FullGraphTrainer, halo: RowExchange) -> None:
    """One epoch's model work: the training forward and backward, then the evaluation
    forward (every epoch evaluates, and its time is in the epoch's compute)."""
    trainer.model.train()
    logits = trainer.model(trainer.x, trainer.graph, halo)
    mask = trainer.part.train_mask
    loss = F.cross_entropy(logits[mask], trainer.part.y[mask], reduction="sum") / trainer.split_sizes[0]
    loss.backward()
    trainer.model.zero_grad(set_to_none=True)
    trainer.model.eval()
    with torch.no_grad():
        trainer.model(trainer.x, trainer.graph, halo)


def compute_alone(trainer: FullGraphTrainer, repeats: int = 3) -> list[float]:
    """Every rank's median seconds of one epoch's model work (:func:`_step`) with the machine
    to itself (all ranks call it; every rank gets the list, in rank order)."""
    ctx = trainer.ctx
    silent = _Silent(AllToAllHalo(ctx, halo_plan(trainer.part), Hooks()))
    cpu_state = torch.get_rng_state()  # dropout draws here must not shift training's stream
    was_training = trainer.model.training
    mine = 0.0
    for r in range(ctx.world_size):
        ctx.barrier()
        if ctx.rank == r:
            _step(trainer, silent)  # warm-up, untimed
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                _step(trainer, silent)
                times.append(time.perf_counter() - t0)
            mine = statistics.median(times)
        ctx.barrier()
    torch.set_rng_state(cpu_state)
    trainer.model.train(was_training)
    return ctx.all_gather(torch.tensor([mine], dtype=torch.float64))[:, 0].tolist()


def alone_summary(alone: list[float], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``summary.json`` keys: each rank's compute alone and the shared/alone ratio of the
    busiest rank (how much the shared cores slowed compute)."""
    busiest = max(alone)
    shared = statistics.mean(r["time_busiest_s"]["compute"] for r in rows) if rows else 0.0
    return {"compute_alone_s_by_rank": alone, "compute_alone_s": busiest,
            "compute_shared_over_alone": shared / busiest if busiest > 0 else None}
