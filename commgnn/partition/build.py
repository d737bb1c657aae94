"""Turn a node -> part assignment into per-rank :class:`LocalPartition` objects.

Everything is computed with whole-tensor operations (sorts, bincounts, gathers); the
only Python loop runs over the requested ranks to slice their blocks out. One pass:

1. ``order`` = nodes sorted stably by part, so part ``r``'s owned nodes are a contiguous
   run in ascending global id, and ``local_row[v]`` = v's row on its owner.
2. Cross edges (source part != target part) give halo pairs ``(receiver, owner, node)``.
   Encoded as ``(receiver * P + owner) * N + node`` and made unique, they come out sorted
   by receiver, then owner, then global id: the halo order of the contract. Re-sorting
   the same pairs stably by owner gives every owner's send blocks in (peer, global id)
   order, which is why the send and halo blocks line up row for row.
3. Local sources are ``local_row`` for owned sources and ``n_own + halo position`` for
   halo sources (``return_inverse`` of the unique gives the position for free); edges are
   sorted by (position of the target in ``order``, local source), which groups them by
   target rank and sorts each rank's edges by local target, then local source.

Slices are cloned so that saving one rank does not drag the full-graph storage along
(``torch.save`` writes a view's whole underlying storage).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

from commgnn.errors import PartitionError
from commgnn.partition.base import check_edge_index, check_parts
from commgnn.partition.local import LocalPartition

_MAX_KEY = 2**63 - 1


def _attr(data: Any, name: str) -> Any:
    """``data.name`` or ``None`` (PyG's ``Data`` raises AttributeError for unset keys)."""
    return getattr(data, name, None)


def _num_classes(data: Any) -> int:
    total = _attr(data, "num_classes_total")
    if total is not None:
        return int(total)
    y = _attr(data, "y")
    if y is None or y.numel() == 0:
        raise PartitionError("data has no labels y and no num_classes_total")
    return int(y.max()) + 1


def build_local_partitions(data: Any, parts: Tensor, num_parts: int) -> list[LocalPartition]:
    """All ``num_parts`` :class:`LocalPartition` objects, rank order, following local.py's contract.

    ``data`` needs ``x``, ``edge_index`` and ``y``; ``train_mask``/``val_mask``/``test_mask``
    default to all-False when absent, ``num_classes_total`` to ``int(y.max()) + 1``.
    """
    return _build(data, parts, num_parts, list(range(num_parts)))


def build_local_partition(data: Any, parts: Tensor, num_parts: int, rank: int) -> LocalPartition:
    """Only rank ``rank``'s :class:`LocalPartition` (same result as ``build_local_partitions(...)[rank]``).

    Works on the edges touching ``rank`` only, so the temporaries scale with that rank's
    share of the graph rather than with P copies of it.
    """
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < num_parts:
        raise PartitionError(f"rank must be in [0, {num_parts}), got {rank!r}")
    return _build(data, parts, num_parts, [rank])[0]


def _build(data: Any, parts: Tensor, num_parts: int, ranks: Sequence[int]) -> list[LocalPartition]:
    x = _attr(data, "x")
    y = _attr(data, "y")
    if x is None or y is None:
        raise PartitionError("data must have node features x and labels y to be partitioned")
    n = int(x.size(0))
    if y.size(0) != n:
        raise PartitionError(f"data.y has {y.size(0)} rows but data.x has {n}")
    P = num_parts
    parts = check_parts(parts, n, P)
    edge_index = check_edge_index(_attr(data, "edge_index"), n)
    if P * P * n > _MAX_KEY or n * n > _MAX_KEY:
        raise PartitionError(f"graph of {n} nodes with {P} parts is too large for 64-bit sort keys")
    num_classes = _num_classes(data)
    masks = {}
    for name in ("train_mask", "val_mask", "test_mask"):
        m = _attr(data, name)
        masks[name] = torch.zeros(n, dtype=torch.bool) if m is None else m.to("cpu", torch.bool)

    src, dst = edge_index[0], edge_index[1]
    in_deg = torch.bincount(dst, minlength=n)

    # 1. Owned nodes: grouped by part, ascending global id within a part (stable sort).
    sizes = torch.bincount(parts, minlength=P)
    own_start = torch.zeros(P + 1, dtype=torch.int64)
    own_start[1:] = torch.cumsum(sizes, 0)
    order = torch.argsort(parts, stable=True)
    pos = torch.empty(n, dtype=torch.int64)
    pos[order] = torch.arange(n, dtype=torch.int64)
    local_row = pos - own_start[parts]

    sp, tp = parts[src], parts[dst]
    all_ranks = len(ranks) == P
    if not all_ranks:
        # Keep the edges this subset receives on (target owned) or sends from (source owned).
        wanted = torch.zeros(P, dtype=torch.bool)
        wanted[torch.tensor(list(ranks), dtype=torch.int64)] = True
        keep = wanted[tp] | wanted[sp]
        src, dst, sp, tp = src[keep], dst[keep], sp[keep], tp[keep]

    # 2. Halo plan from the cross edges, keyed (receiver, owner, global id).
    # One nonzero() and three gathers instead of three boolean-mask passes over E.
    cross = torch.nonzero(sp != tp).flatten()
    c_src, c_sp, c_tp = src[cross], sp[cross], tp[cross]
    hkeys, hinv = torch.unique((c_tp * P + c_sp) * n + c_src, return_inverse=True)
    h_tp, h_sp, h_src = hkeys // (P * n), (hkeys // n) % P, hkeys % n
    pair = torch.bincount(h_tp * P + h_sp, minlength=P * P).view(P, P)  # [receiver, owner]
    halo_start = torch.zeros(P + 1, dtype=torch.int64)
    halo_start[1:] = torch.cumsum(pair.sum(1), 0)
    send_start = torch.zeros(P + 1, dtype=torch.int64)
    send_start[1:] = torch.cumsum(pair.sum(0), 0)
    # Stable by owner keeps (receiver, global id) order inside each owner's run.
    send_rows = local_row[h_src[torch.argsort(h_sp, stable=True)]]

    # 3. Local edges: sources renumbered, then sorted by (target's grouped position, source).
    ls = local_row[src]
    ls[cross] = sizes[c_tp] + (hinv - halo_start[h_tp[hinv]])
    del c_src, c_sp, hinv, cross
    if not all_ranks:
        keep = wanted[tp]
        ls, dst, tp = ls[keep], dst[keep], tp[keep]
    edge_counts = torch.bincount(tp, minlength=P)
    # Sorting the keys themselves (not argsort + gathers) and decoding them is cheaper:
    # the quotient is the target's grouped position, the remainder the local source.
    key = torch.sort(pos[dst] * n + ls).values
    del dst, tp, ls
    edge_rank = torch.repeat_interleave(torch.arange(P, dtype=torch.int64), edge_counts)
    ls, ld = key % n, key // n - own_start[edge_rank]
    del key, edge_rank
    edge_start = torch.zeros(P + 1, dtype=torch.int64)
    edge_start[1:] = torch.cumsum(edge_counts, 0)

    pair_list = pair.tolist()
    out = []
    for r in ranks:
        owned = order[own_start[r]:own_start[r + 1]].clone()
        halo = h_src[halo_start[r]:halo_start[r + 1]].clone()
        e0, e1 = int(edge_start[r]), int(edge_start[r + 1])
        out.append(LocalPartition(
            rank=r, num_parts=P, num_nodes_global=n, num_classes=num_classes,
            global_ids=owned,
            halo_global_ids=halo,
            recv_counts=list(pair_list[r]),
            send_index=send_rows[send_start[r]:send_start[r + 1]].clone(),
            send_counts=[pair_list[q][r] for q in range(P)],
            edge_index=torch.stack([ls[e0:e1], ld[e0:e1]]),
            in_degree=torch.cat([in_deg[owned], in_deg[halo]]),
            x=x[owned],
            y=y[owned] if y.dtype.is_floating_point else y[owned].to(torch.int64),
            train_mask=masks["train_mask"][owned],
            val_mask=masks["val_mask"][owned],
            test_mask=masks["test_mask"][owned],
        ))
    return out
