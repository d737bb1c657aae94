"""How the federated server (rank 0) and the ranks hosting clients exchange messages.

With one process (world size 1) the server and every client live together and each call
returns at once. With W > 1 ranks, rank 0 is the server and client ``c`` lives on rank
``1 + c mod (W - 1)``; messages are Python objects (protocol messages, tensors) moved by
``torch.distributed``'s object collectives, whose time-outs the :class:`DistContext`
sets. The bytes the run reports are the protocol's own message sizes (what each message
carries between organisations), counted by the server, not pickle's framing.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from commgnn.distributed.context import DistContext
from commgnn.errors import DataError


class Transport:
    """Server/client message moves over a :class:`DistContext` (or none: one process)."""

    def __init__(self, ctx: DistContext | None, n_clients: int) -> None:
        self.ctx = ctx
        self.world = ctx.world_size if ctx is not None else 1
        self.rank = ctx.rank if ctx is not None else 0
        self.n_clients = n_clients

    @property
    def is_server(self) -> bool:
        return self.rank == 0

    def rank_of(self, client: int) -> int:
        """The rank hosting ``client`` (0 in one process)."""
        return 0 if self.world == 1 else 1 + client % (self.world - 1)

    def hosted(self) -> list[int]:
        """The clients this rank hosts."""
        return [c for c in range(self.n_clients) if self.rank_of(c) == self.rank]

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` at the server (None elsewhere)."""
        if self.world == 1:
            return [obj]
        out: list[Any] | None = [None] * self.world if self.is_server else None
        dist.gather_object(obj, out, dst=0, group=self.ctx.group)  # type: ignore[union-attr]
        return out

    def gather_dicts(self, part: dict[int, Any]) -> dict[int, Any] | None:
        """Merge per-rank ``{client: message}`` dicts at the server."""
        parts = self.gather(part)
        if parts is None:
            return None
        merged: dict[int, Any] = {}
        for p in parts:
            merged.update(p)
        return dict(sorted(merged.items()))

    def scatter_dicts(self, full: dict[int, Any] | None) -> dict[int, Any]:
        """The server's ``{client: message}`` -> each rank gets its own clients' entries."""
        if self.world == 1:
            return dict(full or {})
        per_rank: list[Any] | None = None
        if self.is_server:
            per_rank = [{c: m for c, m in (full or {}).items() if self.rank_of(c) == q} for q in range(self.world)]
        out: list[Any] = [None]
        dist.scatter_object_list(out, per_rank, src=0, group=self.ctx.group)  # type: ignore[union-attr]
        return out[0]

    def broadcast(self, obj: Any) -> Any:
        """The server's ``obj`` on every rank."""
        if self.world == 1:
            return obj
        box = [obj if self.is_server else None]
        dist.broadcast_object_list(box, src=0, group=self.ctx.group)  # type: ignore[union-attr]
        return box[0]

    def agree(self, digest: str, what: str) -> None:
        """Check that every rank computed the same ``what`` (by its ``digest``); on a
        mismatch every rank raises the same :class:`DataError`, naming the ranks that differ,
        instead of training on placements that disagree."""
        if self.world == 1:
            return
        got = self.gather(digest)
        bad = [q for q, d in enumerate(got) if d != digest] if got is not None else None
        bad = self.broadcast(bad)
        if bad:
            who = f"rank{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))}"
            raise DataError(f"{who} computed another {what} than rank 0 (other data, settings or library "
                            f"versions?): give every rank the same files and flags, or a client map (--split file)")
