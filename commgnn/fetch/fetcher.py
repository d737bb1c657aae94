"""Feature rows of any node: own rows read in place, remote rows served by a cache or
fetched from their owners in one request-reply round per step.

Rank r owns the rows ``table: [n_own, F]``; every node v has an owner ``owner[v]`` and a
row ``row[v]`` on it (both ``[N]`` int32, replicated: 8 bytes a node). For a step's nodes
``ids: [n]`` (unique global ids)::

    own     = owner[ids] == r          -> table[row[ids[own]]]
    remote  = the rest                 -> cache.lookup        (hits: no bytes)
    missed  = remote & ~hit            -> request_reply(owner, row) in one round
                                          (ids out, rows back), then cache.admit

Rows travel as float32/64 or, with ``bits`` in 1, 2, 4, 8, as the halo exchange's packed
stochastic codes (:mod:`commgnn.comm.quant`: ``ceil(F b / 8) + 8`` bytes a row, within
one quantisation step of the owner's row, unbiased). What the cache keeps is what arrived.

The fetcher records each step's remote requests (before the cache) so that the epoch's
hit rate can be compared with an offline-optimal cache of the same size on the same trace
(:mod:`commgnn.fetch.optimal`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from commgnn.comm import quant
from commgnn.comm.sparse_codec import block_bytes, decode_block, encode_block, exchange_blocks
from commgnn.distributed.context import DistContext
from commgnn.distributed.events import Hooks, TrafficClass
from commgnn.fetch.row_cache import RowCache, StaticCache
from commgnn.distributed.request import all_to_all, request_reply_sorted
from commgnn.fetch.adaptive import AdaptiveBits, decode_rows, encode_rows, row_bytes


class FeatureFetcher:
    """Reads ``[n, F]`` rows for global ids from this rank's table, a cache and the owners."""

    def __init__(self, ctx: DistContext, hooks: Hooks, *, table: Tensor, owner: Tensor, row: Tensor,
                 cache: RowCache | None = None, bits: int | str = 32, budget_bytes: float = 0.0, seed: int = 0,
                 group: dist.ProcessGroup | None = None, record_trace: bool = True, sparse: bool = False) -> None:
        """``table [n_own, F]``: this rank's rows; ``owner [N]`` / ``row [N]``: every node's
        owner rank and row there; ``bits``: 32, 1, 2, 4, 8 or ``"adaptive"`` (widths per
        owner within ``budget_bytes`` of rows received per epoch, :mod:`commgnn.fetch.adaptive`);
        ``group``: the communicator (a background prefetch gets its own); ``record_trace``:
        keep the epoch's request trace; ``sparse``: replies through the lossless sparse
        codec (``bits`` must be 32)."""
        if sparse and bits != 32:
            raise ValueError("sparse fetches carry float32 values (bits = 32)")
        self.sparse = sparse
        self.ctx, self.hooks, self.group = ctx, hooks, group
        self.table, self.owner, self.row = table, owner, row  # shared with the sampler: no second [N] map
        self.cache, self.bits = cache, bits
        self.adaptive = AdaptiveBits(ctx.world_size, int(table.shape[1]), budget_bytes) if bits == "adaptive" else None
        self.gen = torch.Generator().manual_seed(seed)
        self.record_trace = record_trace
        self.trace: list[Tensor] = []
        self.remote_requests = 0
        """Remote rows the steps' fetches asked for (``fetch_rows``, before the cache), since
        the owner of this counter last reset it (recorded or not in :attr:`trace`)."""
        self.rows_fetched = 0
        self.rows_requested = 0
        self.bytes_saved = 0
        """Bytes the cache's hits kept off the wire (ids out, rows back at the widths in force
        when they hit), since the owner of this counter last reset it."""

    @property
    def width(self) -> int:
        return int(self.table.shape[1])

    def fetch(self, ids: Tensor, *, kind: TrafficClass = "fetch_rows", use_cache: bool = True) -> Tensor:
        """``[n, F]`` rows (table dtype) of the unique global ``ids [n]``. Every rank must
        call it the same number of times (it runs one request-reply round when distributed).

        Memory: the round holds the rows this rank serves to the others and the rows it
        receives; the ``[n, F]`` result is allocated only after it, and the received rows
        are scattered into it straight from owner order, with no copy in request order
        between (``benchmarks/fetch_memory.py``: a fetch's peak is 1.6-1.8x its result)."""
        ids = ids.to(torch.int64)
        own = self.owner[ids] == self.ctx.rank
        if not self.ctx.is_distributed:
            return self.table[self.row[ids]]
        # A rank whose batch is all its own (or empty) still enters the round below with no
        # requests: the others' requests may be for its rows, and a skipped collective would
        # leave them waiting until the time-out.
        rpos = (~own).nonzero().flatten()  # positions, not masks: index_copy_ beats masked assignment
        rids = ids[rpos]
        if kind == "fetch_rows":
            self.remote_requests += int(rids.numel())
            if self.record_trace:
                self.trace.append(rids)
        self.rows_requested += int(rids.numel())
        hpos, cached = None, None
        if self.cache is not None and use_cache:
            hit, cached = self.cache.lookup(rids)
            hpos = rpos[hit]
            self.bytes_saved += self._wire_bytes(rids[hit], cached)
            rpos, rids = rpos[~hit], rids[~hit]
        if self.adaptive is not None:
            rows, order = self._remote_adaptive(rids, kind)
        elif self.sparse:
            rows, order = self._remote_sparse(rids, kind)
        else:
            rows, order = self._remote(rids, kind)
        out = self.table.new_empty((ids.numel(), self.width))
        opos = own.nonzero().flatten()
        out.index_copy_(0, opos, self.table[self.row[ids[opos]]])
        if hpos is not None and cached is not None:
            out.index_copy_(0, hpos, cached.to(out.dtype))
            del cached
        out.index_copy_(0, rpos[order], rows.to(out.dtype))
        self.rows_fetched += int(rids.numel())
        if self.cache is not None and use_cache and not isinstance(self.cache, StaticCache):
            # a dynamic cache keeps the first rows offered when they do not all fit: offer
            # them in request order, as they were asked for
            inv = torch.empty_like(order)
            inv[order] = torch.arange(order.numel())
            self.cache.admit(rids, rows[inv])
        return out

    def _wire_bytes(self, rids: Tensor, rows: Tensor) -> int:
        """What fetching ``rids`` (whose rows are ``rows``) now would cost: an id each way
        out, a row each back, at the width each owner would send (the adaptive widths now in
        force), or as one sparse block per owner (:func:`block_bytes`) with its 8-byte size."""
        idb = 4 if self.table.shape[0] < 2**31 else 8
        esz = self.table.element_size()
        owners = self.owner[rids].to(torch.int64)
        if self.sparse:
            rows = rows.to(self.table.dtype)
            return int(rids.numel()) * idb + sum(8 + block_bytes(rows[owners == q]) for q in owners.unique().tolist())
        if self.adaptive is None:
            return int(rids.numel()) * (row_bytes(self.width, int(self.bits), esz) + idb)
        per_owner = torch.bincount(owners, minlength=self.ctx.world_size).tolist()
        return sum(c * (row_bytes(self.width, b, esz) + idb) for c, b in zip(per_owner, self.adaptive.bits) if c)

    def _remote(self, rids: Tensor, kind: TrafficClass) -> tuple[Tensor, Tensor]:
        """One request-reply round: ``(rows, order)``, ``rows[i]`` the decoded row of
        ``rids[order[i]]`` (owner order, as received)."""
        small = torch.int32 if self.table.shape[0] < 2**31 else torch.int64  # 4-byte ids on the wire
        bits, width, dtype = self.bits, self.width, self.table.dtype

        def serve(req: Tensor) -> Tensor:
            rows = self.table[req.to(torch.int64)]
            return rows if bits == 32 else quant.encode(rows, bits, self.gen)

        got, order = request_reply_sorted(self.ctx, self.hooks, self.owner[rids], self.row[rids].to(small), serve,
                                          req_kind="fetch_ids", rep_kind=kind, group=self.group)
        return (got if bits == 32 else quant.decode(got, bits, width, dtype)), order

    def _remote_sparse(self, rids: Tensor, kind: TrafficClass) -> tuple[Tensor, Tensor]:
        """One round whose replies are sparse-codec blocks, one per asker::

            counts -> ids -> (owner encodes each asker's rows) block sizes -> blocks

        Four all-to-alls (the block sizes are the extra one); ``(rows, order)`` back as
        :meth:`_remote`'s, bit for bit the owners' (a -0.0 arrives as 0.0: see
        :mod:`commgnn.comm.sparse_codec`)."""
        ctx, P, d, dtype = self.ctx, self.ctx.world_size, self.width, self.table.dtype
        owners = self.owner[rids].to(torch.int64)
        order = torch.sort(owners, stable=True).indices
        counts = torch.bincount(owners, minlength=P)
        in_counts = all_to_all(ctx, self.group, counts, [1] * P, [1] * P).tolist()
        ids = self.row[rids[order]].to(torch.int32 if self.table.shape[0] < 2**31 else torch.int64)
        got = all_to_all(ctx, self.group, ids, counts.tolist(), in_counts)
        empty = self.table.new_zeros((0,), dtype=torch.uint8)
        blocks = [encode_block(self.table[part.to(torch.int64)]) if n else empty
                  for part, n in zip(torch.split(got, in_counts), in_counts)]
        for q, b in enumerate(blocks):
            if q != ctx.rank:
                self.hooks.sent("fetch_ids", -1, q, 8 + int(counts[q]) * ids.element_size())  # count, ids
                self.hooks.sent(kind, -1, q, 8 * int(b.numel() > 0) + int(b.numel()))  # block size, block
        back = exchange_blocks(blocks, [c > 0 for c in counts.tolist()],
                               lambda t, o, i: all_to_all(ctx, self.group, t, o, i), self.table.device)
        rows = [decode_block(seg, c, d, dtype) for seg, c in zip(back, counts.tolist()) if c]
        return (torch.cat(rows) if rows else torch.empty((0, d), dtype=dtype, device=self.table.device)), order

    def _remote_adaptive(self, rids: Tensor, kind: TrafficClass) -> tuple[Tensor, Tensor]:
        """One round with per-owner widths: the counts go out with the widths this rank
        wants from each owner, the replies come back as one byte buffer split by peer;
        ``(rows, order)`` as :meth:`_remote`'s."""
        ctx, P, d, dtype = self.ctx, self.ctx.world_size, self.width, self.table.dtype
        assert self.adaptive is not None
        bits = self.adaptive.bits
        owners = self.owner[rids].to(torch.int64)
        order = torch.sort(owners, stable=True).indices
        counts = torch.bincount(owners, minlength=P)
        header = all_to_all(ctx, self.group, torch.stack([counts, torch.tensor(bits)], dim=1), [1] * P, [1] * P)
        in_counts, asked = header[:, 0].tolist(), header[:, 1].tolist()
        ids = self.row[rids[order]].to(torch.int32 if self.table.shape[0] < 2**31 else torch.int64)
        got = all_to_all(ctx, self.group, ids, counts.tolist(), in_counts)
        payloads, out_bytes = [], []
        for q, part in enumerate(torch.split(got, in_counts)):  # a loop over peers, not rows
            pay = encode_rows(self.table[part.to(torch.int64)], int(asked[q]), self.gen)
            payloads.append(pay)
            out_bytes.append(int(pay.numel()))
        in_bytes = [c * row_bytes(d, bits[o], self.table.element_size()) for o, c in enumerate(counts.tolist())]
        for q in range(P):
            if q != ctx.rank:
                self.hooks.sent("fetch_ids", -1, q, 16 + int(counts[q]) * ids.element_size())  # count, width, ids
                self.hooks.sent(kind, -1, q, out_bytes[q])
        back = all_to_all(ctx, self.group, torch.cat(payloads), out_bytes, in_bytes)
        rows = []
        for o, (seg, c) in enumerate(zip(torch.split(back, in_bytes), counts.tolist())):
            r, r2 = decode_rows(seg, c, d, bits[o], dtype)
            if c and kind == "fetch_rows":  # a cache's one-time fill is not an epoch's traffic
                self.adaptive.observe(o, r2)
            rows.append(r)
        return torch.cat(rows), order

    def end_epoch(self) -> None:
        """Epoch boundary: an adaptive codec re-solves its widths."""
        if self.adaptive is not None:
            self.adaptive.end_epoch()

    def take_trace(self) -> list[Tensor]:
        """The recorded per-step remote requests since the last call (then forgotten)."""
        trace, self.trace = self.trace, []
        return trace

    def state_dict(self) -> dict[str, Any]:
        return {"gen": self.gen.get_state(),
                "cache": self.cache.state_dict() if self.cache is not None else None,
                "adaptive": self.adaptive.state_dict() if self.adaptive is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.gen.set_state(state["gen"])
        if self.cache is not None and state.get("cache") is not None:
            self.cache.load_state_dict(state["cache"])
        if self.adaptive is not None and state.get("adaptive") is not None:
            self.adaptive.load_state_dict(state["adaptive"])
