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


P2P_ROW_BYTES = 256
"""gloo: rows at least this wide go point to point (:func:`all_to_all`)."""


def all_to_all(ctx: DistContext, group: dist.ProcessGroup | None, send: Tensor, out_counts: list[int],
               in_counts: list[int]) -> Tensor:
    """``out_counts[q]`` consecutive rows of ``send`` to rank q, and ``[sum(in_counts), ...]``
    back, ``in_counts[q]`` rows from rank q, in rank order (uncounted).

    NCCL, and gloo for rows narrower than :data:`P2P_ROW_BYTES` (counts, ids, byte
    payloads), run one ``all_to_all_single``. Over gloo, wider rows (feature rows) go as
    point-to-point messages posted together (``batch_isend_irecv``): gloo's
    ``all_to_all_single`` sends and receives one after the other, so on a full-duplex link
    it took twice as long (50 MB each way between two hosts at 100 Mbit/s, rows of 1,024
    float32: 8.77 s, against 4.57 s this way; ``benchmarks/peers/alltoall_duplex.py``), while
    for small messages the point-to-point path costs about twice the latency (740 against
    370 us on loopback). The
    choice depends on the row shape only, which every rank shares, so all ranks take the
    same path. A rank's rows to itself are copied."""
    recv = send.new_empty((sum(in_counts), *send.shape[1:]))
    send = send.contiguous()
    g = group if group is not None else ctx.group
    if ctx.backend == "nccl" or _row_bytes(send) < P2P_ROW_BYTES:
        dist.all_to_all_single(recv, send, output_split_sizes=in_counts, input_split_sizes=out_counts, group=g)
        return recv
    out_at = [0, *torch.tensor(out_counts, dtype=torch.int64).cumsum(0).tolist()]
    in_at = [0, *torch.tensor(in_counts, dtype=torch.int64).cumsum(0).tolist()]
    me = ctx.rank
    recv[in_at[me]:in_at[me + 1]] = send[out_at[me]:out_at[me + 1]]
    ops = []
    for q in range(ctx.world_size):
        if q == me:
            continue
        if in_counts[q]:  # the sender skips the same empty message: both know its size
            ops.append(dist.P2POp(dist.irecv, recv[in_at[q]:in_at[q + 1]], _peer(g, q), group=g))
        if out_counts[q]:
            ops.append(dist.P2POp(dist.isend, send[out_at[q]:out_at[q + 1]], _peer(g, q), group=g))
    if ops:
        for req in dist.batch_isend_irecv(ops):
            req.wait()
    return recv


def _peer(group: dist.ProcessGroup | None, rank: int) -> int:
    """The global rank of ``rank`` of ``group`` (the P2P ops take global ranks)."""
    return rank if group is None else dist.get_global_rank(group, rank)


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
