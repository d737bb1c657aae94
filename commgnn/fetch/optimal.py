"""Offline optima for a trace of remote-row requests: what a cache could at best achieve.

A *trace* is one ``[n_i]`` int64 tensor of unique ids per step, in step order (what
:meth:`~commgnn.fetch.row_cache.RowCache.lookup` sees). Two bounds, for a cache of ``capacity``
rows:

* :func:`optimal_static_hit_rate` -- the best *fixed* set of rows in hindsight: the
  ``capacity`` most requested ids. This is the optimum GNNLab (Yang et al., EuroSys 2022)
  compares its pre-sampled static cache to; a static policy can only approach it.
* :func:`belady_hit_rate` -- Belady's MIN (Belady, "A study of replacement algorithms for a
  virtual-storage computer", IBM Systems Journal 1966) with *bypass*, at step granularity:
  after each step keep, of the rows held and the rows just requested, the ``capacity``
  whose next request comes soonest (never-again rows are never kept). This maximises hits
  over every policy with the same capacity that starts empty, so it bounds LRU and any
  other dynamic cache from above.

Why step granularity: the caches look a whole step up at once (:meth:`lookup`) and only
then admit, so a step's hits are ``|contents at step start ∩ step|``. Replaying the trace
flattened, request by request, would be a different problem whose MIN can be *worse*:
with one slot, holding ``a`` and a step ``[b, a]`` followed by ``[b]``, the flat MIN cannot
both hit ``a`` and keep ``b``, while a step-level cache does both. So next uses are counted
in steps, each step's hits are taken first, then its misses compete for the slots (the
usual exchange argument for MIN carries over to batched requests: keeping a row needed
sooner instead of one needed later never loses a hit). The order of ids within a step
does not matter.
"""

from __future__ import annotations

import heapq
from typing import Sequence

import torch
from torch import Tensor


def _flatten(trace: Sequence[Tensor]) -> Tensor:
    """The requests of all steps in order: ``[R]`` int64 on the CPU."""
    if len(trace) == 0:
        return torch.zeros(0, dtype=torch.long)
    return torch.cat([t.reshape(-1).long().cpu() for t in trace])


def optimal_static_hit_rate(trace: Sequence[Tensor], capacity: int) -> float:
    """Hits / requests of the best fixed set of ``capacity`` rows (the most requested ids).

    ``trace``: one ``[n_i]`` unique int64 id tensor per step. 0.0 for an empty trace."""
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {capacity}")
    req = _flatten(trace)
    if req.numel() == 0:
        return 0.0
    counts = torch.unique(req, return_counts=True)[1]
    # Which of several equally frequent ids is chosen does not change the sum.
    top = torch.topk(counts, min(capacity, counts.numel())).values
    return int(top.sum()) / req.numel()


def next_use_step(trace: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """The flattened requests ``[R]`` and, for each, the index of the next step requesting
    the same id (``len(trace)`` if none), ``[R]`` int64.

    A stable sort groups equal ids with their positions ascending; a position's successor in
    its group is its next request, which lies in a later step since a step's ids are unique."""
    req = _flatten(trace)
    num_steps, r = len(trace), req.numel()
    step_of = torch.repeat_interleave(torch.arange(num_steps), torch.tensor([t.numel() for t in trace],
                                                                            dtype=torch.long))
    nxt = torch.full((r,), num_steps, dtype=torch.long)
    if r >= 2:
        ids_sorted, order = torch.sort(req, stable=True)
        same = ids_sorted[1:] == ids_sorted[:-1]
        nxt[order[:-1][same]] = step_of[order[1:][same]]
    return req, nxt


def belady_hit_rate(trace: Sequence[Tensor], capacity: int) -> float:
    """Hits / requests of Belady's MIN with bypass at step granularity, starting empty (the
    optimal dynamic cache for step-wise lookups; see the module docstring).

    ``trace``: one ``[n_i]`` unique int64 id tensor per step. 0.0 for an empty trace. The
    replacement loop runs in Python over the requests (offline analysis, not a training
    hot path) with a max-heap on next use and lazy deletion: O(R log C)."""
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {capacity}")
    req, nxt_t = next_use_step(trace)
    r, never = req.numel(), len(trace)
    if r == 0 or capacity == 0:
        return 0.0
    ids, nxt = req.tolist(), nxt_t.tolist()
    cached: dict[int, int] = {}       # id -> step of its next request
    heap: list[tuple[int, int]] = []  # (-next step, id); stale once cached[id] differs
    hits, start = 0, 0
    for t in trace:
        stop = start + t.numel()
        misses = []
        # All hits of the step first: they are served from the contents at the step's start.
        for i in range(start, stop):
            v = ids[i]
            if v in cached:
                hits += 1
                cached[v] = nxt[i]
                heapq.heappush(heap, (-nxt[i], v))
            elif nxt[i] < never:  # a row never requested again is bypassed
                misses.append(i)
        # Then the misses compete with the held rows: keep the soonest-needed `capacity`.
        for i in misses:
            v, n = ids[i], nxt[i]
            if len(cached) < capacity:
                cached[v] = n
                heapq.heappush(heap, (-n, v))
                continue
            while cached.get(heap[0][1]) != -heap[0][0]:
                heapq.heappop(heap)  # stale: refreshed by a later hit, or evicted
            far_next, far_id = -heap[0][0], heap[0][1]
            if far_next > n:  # on a tie either choice gives the same hits; keep the held row
                heapq.heapreplace(heap, (-n, v))
                del cached[far_id]
                cached[v] = n
        if len(heap) > 4 * capacity + 64:
            # Compact the stale entries so the heap stays O(C), hence log C per operation.
            heap = [(-m, u) for u, m in cached.items()]
            heapq.heapify(heap)
        start = stop
    return hits / r
