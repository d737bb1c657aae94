"""Counted collectives: the byte model of a ring all-reduce, and an all-reduce that reports it.

Shared by the gradient strategies (:mod:`commgnn.comm.grad`), the gossip wrappers
(:mod:`commgnn.comm.gossip`) and the trainers, which all put all-reduces on the wire.

Bytes: ``torch.distributed`` does not expose what a backend puts on the wire, so we
count the ring all-reduce algorithm's payload, ``2 (P-1)/P * n * s`` bytes sent per rank
for ``n`` elements of ``s`` bytes (reduce-scatter plus all-gather), the lower bound any
bandwidth-optimal all-reduce reaches. Both gloo (ring / halving-doubling) and NCCL (ring)
send this much for large buckets.
"""

from __future__ import annotations

import torch

from commgnn.distributed.context import DistContext
from commgnn.distributed.events import Hooks, TrafficClass


def ring_allreduce_bytes(numel: int, elem_size: int, world_size: int) -> int:
    """Payload one rank sends in a ring all-reduce of ``numel`` elements."""
    return (2 * (world_size - 1) * numel * elem_size) // world_size


def counted_all_reduce(ctx: DistContext, hooks: Hooks, t: torch.Tensor, kind: TrafficClass) -> torch.Tensor:
    """In-place SUM all-reduce of ``t``, reported to ``hooks`` as ``kind`` traffic."""
    if ctx.is_distributed:
        hooks.sent(kind, -1, -1, ring_allreduce_bytes(t.numel(), t.element_size(), ctx.world_size))
        with hooks.timed("comm"):
            ctx.all_reduce(t, "sum")
    return t
