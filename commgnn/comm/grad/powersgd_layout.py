"""Where torch's PowerSGD hook keeps each parameter's state, so that it survives a change
of DDP's bucket layout (an exact resume).

torch's ``powerSGD_hook`` keeps three flat tensors per bucket, all laid out in the order
of the bucket's parameters:

- ``error_dict[b]``: the error-feedback residual, one segment of ``numel`` per gradient,
  in bucket order (the bucket's flat buffer);
- ``p_memory_dict[b]`` / ``q_memory_dict[b]``: the warm-started factors P (n x r) and
  Q (m x r) of each gradient it compresses (viewed as an n x m matrix, r = min(n, m,
  rank), compressed when ``_should_compress`` says so), grouped by matrix shape in order
  of each shape's first appearance, and in bucket order within a shape.

DDP lays a bucket out in parameter order at first and rebuilds it once, after its first
backward, in the order the gradients became ready. torch asks for ``start_powerSGD_iter >=
2`` so that no state exists before that rebuild. A resumed run builds a new DDP, whose
first step is in parameter order again: the restored state, saved in the rebuilt order,
would meet other gradients (the sizes match, so nothing fails; the run just drifts).
:func:`permute_state` moves each parameter's segments from one order to the other; the
hook wrapper calls it whenever the bucket's order differs from the one the state was
built in. Written here because torch offers no layout-independent PowerSGD state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress


@dataclass(frozen=True)
class Segments:
    """Offsets of each parameter's state in the three flat tensors."""

    error: dict[int, tuple[int, int]]
    """parameter key -> (offset, length) in ``error_dict[b]``."""
    p: dict[int, tuple[int, int]]
    """parameter key -> (offset, length) of its P factor in ``p_memory_dict[b]``."""
    q: dict[int, tuple[int, int]]
    """parameter key -> (offset, length) of its Q factor in ``q_memory_dict[b]``."""


def bucket_segments(keys: Sequence[int], shapes: dict[int, torch.Size], rank: int,
                    min_compression_rate: float) -> Segments:
    """The segments of a bucket holding the parameters ``keys`` in this order, as torch's
    ``powerSGD_hook`` allocates them (``shapes``: each key's parameter shape)."""
    error: dict[int, tuple[int, int]] = {}
    by_shape: dict[tuple[int, int], list[int]] = {}
    off = 0
    for k in keys:
        shape = shapes[k]
        numel = shape.numel()
        error[k] = (off, numel)
        off += numel
        n = shape[0] if len(shape) else 1
        m = numel // n if n else 0
        r = min(n, m, rank)
        if _should_compress(n, m, r, min_compression_rate)[0]:
            by_shape.setdefault((n, m), []).append(k)
    p: dict[int, tuple[int, int]] = {}
    q: dict[int, tuple[int, int]] = {}
    p_off = q_off = 0
    for (n, m), group in by_shape.items():  # dicts keep first-appearance order, as torch's defaultdict
        r = min(n, m, rank)
        for k in group:
            p[k], q[k] = (p_off, n * r), (q_off, m * r)
            p_off, q_off = p_off + n * r, q_off + m * r
    return Segments(error, p, q)


def _moved(flat: torch.Tensor, old: dict[int, tuple[int, int]], new: dict[int, tuple[int, int]]) -> torch.Tensor:
    if set(old) != set(new):
        raise RuntimeError("PowerSGD state: the bucket holds other parameters than the state was built for")
    if flat.numel() != sum(n for _, n in old.values()):  # torch laid its state out otherwise
        raise RuntimeError(f"PowerSGD state: {flat.numel()} entries where this torch's hook layout "
                           f"gives {sum(n for _, n in old.values())}; its state cannot be reordered")
    out = torch.empty_like(flat)
    for k, (o, n) in old.items():
        o2, n2 = new[k]
        if n != n2:
            raise RuntimeError(f"PowerSGD state: parameter {k} has {n} entries, the new layout {n2}")
        out[o2:o2 + n] = flat[o:o + n]
    return out


def permute_state(state: Any, bucket: int, old: Segments, new: Segments) -> None:
    """Move bucket ``bucket``'s error and P/Q memories of ``state`` (a ``PowerSGDState``)
    from layout ``old`` to layout ``new``, in place of the dict entries."""
    if bucket in state.error_dict:
        state.error_dict[bucket] = _moved(state.error_dict[bucket], old.error, new.error)
    if bucket in state.p_memory_dict:
        state.p_memory_dict[bucket] = _moved(state.p_memory_dict[bucket], old.p, new.p)
        state.q_memory_dict[bucket] = _moved(state.q_memory_dict[bucket], old.q, new.q)
