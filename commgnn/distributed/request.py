"""Request-reply between ranks in one round of collectives (no per-node messages).

A rank holds ``m`` requests, each addressed to an owner rank (a node whose feature row or
adjacency it needs). One round moves all of them at once::

    counts[q]   = #requests for owner q                                   [P]
    in_counts   = all_to_all(counts)             P integers: sizes the next two
    got         = all_to_all(requests sorted by owner, splits counts -> in_counts)
    replies     = serve(got)                     the owner answers every request it got
    back        = all_to_all(replies, splits in_counts -> counts)        [m, *reply shape]

and ``back`` is put back in the caller's request order. The count exchange is P integers
per rank; the ids go out in one collective and the answers come back in one. Every rank
must enter the round together (with zero requests if it has none): the trainer gives all
ranks the same number of steps, so the rounds line up.

Bytes are reported to the run's hooks per peer (``req_kind`` for the counts and ids,
``rep_kind`` for the replies, as the payload that travels, e.g. packed quantized rows), and
the wall time as ``phase``. Written here: torch.distributed has the all-to-all but no
request-reply on top of it.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch
import torch.distributed as dist
from torch import Tensor

from commgnn.distributed.context import DistContext
from commgnn.distributed.events import Hooks, Phase, TrafficClass


def _row_bytes(t: Tensor) -> int:
    width = t.element_size()
    for dim in t.shape[1:]:
        width *= dim
    return width


def all_to_all(ctx: DistContext, group: dist.ProcessGroup | None, send: Tensor, out_counts: list[int],
               in_counts: list[int]) -> Tensor:
    """One ``all_to_all_single``: ``out_counts[q]`` leading rows of ``send`` to rank q, and
    ``[sum(in_counts), ...]`` back, ``in_counts[q]`` rows from rank q (uncounted)."""
    recv = send.new_empty((sum(in_counts), *send.shape[1:]))
    dist.all_to_all_single(recv, send.contiguous(), output_split_sizes=in_counts, input_split_sizes=out_counts,
                           group=group if group is not None else ctx.group)
    return recv


def request_reply(ctx: DistContext, hooks: Hooks, owners: Tensor, requests: Tensor,
                  serve: Callable[[Tensor], Tensor], *, req_kind: TrafficClass, rep_kind: TrafficClass,
                  phase: Phase | None = None, group: dist.ProcessGroup | None = None) -> Tensor:
    """Answers ``[m, *shape]`` to ``requests [m, ...]`` addressed to ``owners [m]`` (ranks),
    in request order; ``serve`` runs on the owner with the requests it received (rank
    order of the askers) and returns one answer row per request. Requests addressed to
    this rank itself are served too (locally, without bytes on the wire)."""
    if not ctx.is_distributed:
        return serve(requests)
    back, order = request_reply_sorted(ctx, hooks, owners, requests, serve, req_kind=req_kind,
                                       rep_kind=rep_kind, phase=phase, group=group)
    out = torch.empty_like(back)
    out[order] = back
    return out


def request_reply_sorted(ctx: DistContext, hooks: Hooks, owners: Tensor, requests: Tensor,
                         serve: Callable[[Tensor], Tensor], *, req_kind: TrafficClass, rep_kind: TrafficClass,
                         phase: Phase | None = None,
                         group: dist.ProcessGroup | None = None) -> tuple[Tensor, Tensor]:
    """:func:`request_reply`'s round, its answers left in owner order: ``(back [m, *shape],
    order [m])`` with ``back[i]`` the answer to ``requests[order[i]]``. A caller that
    scatters the answers into a buffer of its own (``buf[pos[order]] = back``) saves the
    ``[m, *shape]`` copy that putting them back in request order costs (for a step's
    feature rows, a step-sized tensor). ``serve``'s answers are released before
    this returns."""
    P = ctx.world_size
    owners = owners.to(torch.int64)
    order = torch.sort(owners, stable=True).indices
    if not ctx.is_distributed:
        return serve(requests[order]), order
    counts = torch.bincount(owners, minlength=P)
    out_counts = counts.tolist()
    timed = hooks.timed(phase) if phase is not None else contextlib.nullcontext()
    with timed:
        in_counts_t = all_to_all(ctx, group, counts.to(torch.int64), [1] * P, [1] * P)
    in_counts = in_counts_t.tolist()
    req = requests[order]
    for q in range(P):
        if q != ctx.rank:  # the count itself is sent to every peer
            hooks.sent(req_kind, -1, q, 8 + out_counts[q] * _row_bytes(req))
    with hooks.timed(phase) if phase is not None else contextlib.nullcontext():
        got = all_to_all(ctx, group, req, out_counts, in_counts)
    del req
    answers = serve(got)
    for q, n in enumerate(in_counts):
        if q != ctx.rank:
            hooks.sent(rep_kind, -1, q, n * _row_bytes(answers))
    with hooks.timed(phase) if phase is not None else contextlib.nullcontext():
        back = all_to_all(ctx, group, answers, in_counts, out_counts)
    return back, order
