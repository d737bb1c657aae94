"""Rank functions of the federated tests (spawned processes import them from here)."""

from __future__ import annotations

from commgnn.distributed.context import DistContext
from commgnn.errors import DataError
from commgnn.federated.transport import Transport


def agree(ctx: DistContext, odd_rank: int | None) -> str:
    """Every rank checks a digest; ``odd_rank`` (if any) holds another one. Returns the
    error message each rank raised ('' when they agreed)."""
    t = Transport(ctx, n_clients=ctx.world_size - 1)
    try:
        t.agree("b" if ctx.rank == odd_rank else "a", "client split")
    except DataError as err:
        return str(err)
    return ""
