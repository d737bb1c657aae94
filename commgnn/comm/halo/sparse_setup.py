"""The one-time exchange of constant input rows, sent sparse and lossless.

``precompute`` (and the sparse-input pattern of the first layer) move the raw feature rows
of the halo once, before training (traffic class ``halo_setup``). Raw features of the usual
graphs are mostly zeros: bag-of-words rows of Coauthor CS keep 59.6 of 6,805 entries,
Physics 33.0 of 8,415, all of them 1.0. A dense fp32 row costs ``4 d`` bytes; this wrapper
sends rank r's block for peer q (``n_q`` rows of width ``d``, ``z_q`` non-zeros) as::

    [format: 1 byte]
    0 dense:            n_q * d * s bytes                   (the rows as they are)
    1 listed values:    n_q * c + z_q * i + z_q * s bytes   (counts, column indices, values)
    2 listed binary:    n_q * c + z_q * i bytes             (every non-zero is exactly 1.0)
    3 bitmap + values:  n_q * ceil(d / 8) + z_q * s bytes   (a bit per column, then values)
    4 bitmap binary:    n_q * ceil(d / 8) bytes

with ``s`` the element size, ``c`` = 2 bytes per row count (4 when d > 32,767) and ``i`` = 1
byte per column index (d <= 256), 2 (d <= 32,768) or 4. Each block takes the smallest
format, so it never costs more than dense plus one byte: lists win on very sparse rows
(CS: 59.6 of 6,805), bitmaps on denser ones (Amazon Computers: 267 of 767, 96 bytes a row
against 536 listed and 3,068 dense). Payloads have a size per peer, so
an all-to-all of the block sizes (one ``int64`` per peer that gets rows, class ``control``)
comes first: two collectives instead of one, for a setup that runs once. Every other traffic class passes
through untouched. Decoding rebuilds the dense ``[sum(in_counts), d]`` rows bit for bit
(a ``-0.0`` comes back as ``0.0``).

Written by hand: no maintained library ships a sparse all-to-all for torch.distributed.
"""

from __future__ import annotations

import torch
from torch import Tensor

from commgnn.comm.halo.exchange import Wrapper

DENSE, VALUES, BINARY, BITMAP_VALUES, BITMAP = 0, 1, 2, 3, 4
_BITS = 1 << torch.arange(8)  # bit j of a bitmap byte = column 8 * byte + j


def _int_dtype(limit: int) -> torch.dtype:
    """Smallest signed integer dtype whose non-negative range holds ``0 .. limit - 1``
    (uint8 for indices below 256: torch has no uint16 arithmetic on every device)."""
    if limit <= 256:
        return torch.uint8
    return torch.int16 if limit <= 32768 else torch.int32


def _bytes(t: Tensor) -> Tensor:
    return t.contiguous().view(torch.uint8).reshape(-1)


def _pack(mask: Tensor) -> Tensor:
    """``[n, d]`` bool -> ``[n * ceil(d / 8)]`` uint8, little-endian bits per byte."""
    n, d = mask.shape
    padded = torch.zeros((n, -(-d // 8) * 8), dtype=torch.uint8, device=mask.device)
    padded[:, :d] = mask
    return (padded.view(n, -1, 8) * _BITS.to(mask.device, torch.uint8)).sum(2, dtype=torch.uint8).reshape(-1)


def _unpack(packed: Tensor, n: int, d: int) -> Tensor:
    bits = (packed.view(n, -1, 1) & _BITS.to(packed.device, torch.uint8)) != 0
    return bits.reshape(n, -1)[:, :d]


def encode_block(rows: Tensor) -> Tensor:
    """``[n, d]`` rows -> one uint8 payload in the smallest of the formats."""
    n, d = rows.shape
    s = rows.element_size()
    dense = torch.cat([rows.new_full((1,), DENSE, dtype=torch.uint8), _bytes(rows)])
    if n == 0:
        return dense
    mask = rows != 0
    vals = rows[mask]  # row-major: each row's non-zeros in column order
    z, binary = vals.numel(), bool((vals == 1).all())
    cb, ib = torch.empty((), dtype=_int_dtype(d + 1)), torch.empty((), dtype=_int_dtype(d))
    value_bytes = 0 if binary else z * s
    listed = n * cb.element_size() + z * ib.element_size() + value_bytes
    bitmap = n * (-(-d // 8)) + value_bytes
    if min(listed, bitmap) + 1 >= dense.numel():
        return dense
    if bitmap < listed:
        parts = [rows.new_full((1,), BITMAP if binary else BITMAP_VALUES, dtype=torch.uint8), _pack(mask)]
    else:
        c = mask.nonzero(as_tuple=True)[1]
        parts = [rows.new_full((1,), BINARY if binary else VALUES, dtype=torch.uint8),
                 _bytes(mask.sum(1).to(cb.dtype)), _bytes(c.to(ib.dtype))]
    if not binary:
        parts.append(_bytes(vals))
    return torch.cat(parts)


def decode_block(payload: Tensor, n: int, d: int, dtype: torch.dtype) -> Tensor:
    """Inverse of :func:`encode_block` for a block of ``n`` rows of width ``d``."""
    fmt, body = int(payload[0]), payload[1:].clone()  # a fresh buffer: dtype views need aligned storage
    if fmt == DENSE:
        return body.view(dtype).reshape(n, d).clone()
    if fmt in (BITMAP, BITMAP_VALUES):
        nb = n * (-(-d // 8))
        mask = _unpack(body[:nb], n, d)
        values_at = nb
    else:
        cdt, idt = _int_dtype(d + 1), _int_dtype(d)
        cb, ib = torch.empty((), dtype=cdt).element_size(), torch.empty((), dtype=idt).element_size()
        counts = body[: n * cb].clone().view(cdt).long()
        z = int(counts.sum())
        cols = body[n * cb: n * cb + z * ib].clone().view(idt).long()
        mask = torch.zeros((n, d), dtype=torch.bool, device=payload.device)
        mask[torch.repeat_interleave(torch.arange(n, device=payload.device), counts), cols] = True
        values_at = n * cb + z * ib
    out = torch.zeros((n, d), dtype=dtype, device=payload.device)
    if fmt in (BINARY, BITMAP):
        out[mask] = 1
    else:
        z = int(mask.sum())
        s = torch.empty((), dtype=dtype).element_size()
        out[mask] = body[values_at: values_at + z * s].clone().view(dtype)
    return out


class SparseSetup(Wrapper):
    """Sends ``halo_setup`` rows (constant inputs, no gradient) in the formats of the module
    docstring; every other class goes to the inner strategy unchanged."""

    def move(self, rows: Tensor, out_counts: list[int], in_counts: list[int], layer: int, kind: str) -> Tensor:
        if kind != "halo_setup" or rows.dim() != 2 or not rows.is_floating_point():
            return self.inner.move(rows, out_counts, in_counts, layer, kind)
        d = rows.shape[1]
        # A peer with no rows gets no block and no size (both sides know the count is 0).
        blocks = [encode_block(b) if n else rows.new_zeros((0,), dtype=torch.uint8)
                  for b, n in zip(rows.split(list(out_counts)), out_counts)]
        sizes = torch.tensor([[b.numel()] for b, n in zip(blocks, out_counts) if n], dtype=torch.int64,
                             device=rows.device).reshape(-1, 1)
        has_out, has_in = [int(n > 0) for n in out_counts], [int(n > 0) for n in in_counts]
        got = iter(self.inner.move(sizes, has_out, has_in, layer, "control").reshape(-1).tolist())
        in_sizes = [int(next(got)) if n else 0 for n in in_counts]
        payload = torch.cat(blocks).reshape(-1, 1)
        recv = self.inner.move(payload, [b.numel() for b in blocks], in_sizes, layer, kind).reshape(-1)
        out = [decode_block(p, n, d, rows.dtype) for p, n in zip(recv.split(in_sizes), in_counts) if n]
        return torch.cat(out) if out else rows.new_zeros((0, d))
