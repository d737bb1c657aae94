"""Fixed-point floats in the ring Z_{2^m} and bit packing of ring elements (written here:
no maintained library packs arbitrary-width integers for torch payloads).

Secure aggregation adds integers modulo ``2^m`` (``m <= 62``): the masks are uniform in
the ring and cancel only under modular addition. A float tensor ``x: [d]`` enters the ring
as fixed point with ``f`` fractional bits::

    q = floor(x 2^f + u),  u ~ U[0, 1)        (stochastic rounding: E[q] = x 2^f)
    r = q mod 2^m                            (two's complement, an int64 in [0, 2^m))

and a sum ``s = sum_u r_u mod 2^m`` decodes as the signed integer it represents (values
``>= 2^(m-1)`` are negative) divided by ``2^f``. Decoding is exact as long as the true
integer sum lies in ``[-2^(m-1), 2^(m-1))``; the caller sizes ``m`` for that
(:class:`~commgnn.federated.secagg.config.SecAggConfig` checks it).

Ring elements are held as ``int64`` tensors. With ``m <= 62`` the sum of two reduced
elements stays below ``2^63``, so ``(a + b) & (2^m - 1)`` never overflows; subtraction
wraps in two's complement, which the mask also reduces correctly.

:func:`pack` writes ``n`` m-bit elements as ``ceil(n m / 8)`` bytes (little-endian bit
order: element ``i`` occupies bits ``[i m, (i + 1) m)`` of the stream), so the bytes a
masked update costs on the wire are the real ones; :func:`unpack` inverts it. Both are
vectorised (numpy ``packbits``/``unpackbits``; plain byte slicing when ``m`` is a
multiple of 8).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

MAX_BITS = 62
"""Largest ring width: two reduced elements must add without overflowing int64."""


def _check_bits(m: int) -> None:
    if not (isinstance(m, int) and 1 <= m <= MAX_BITS):
        raise ValueError(f"ring bits must be an int in [1, {MAX_BITS}], got {m!r}")


def modulus_mask(m: int) -> int:
    """``2^m - 1``: AND with it reduces an int64 modulo ``2^m``."""
    _check_bits(m)
    return (1 << m) - 1


def reduce(x: Tensor, m: int) -> Tensor:
    """``x mod 2^m`` for an integer tensor (negative values wrap): int64 in ``[0, 2^m)``."""
    return x.to(torch.int64) & modulus_mask(m)


def add(a: Tensor, b: Tensor, m: int) -> Tensor:
    """``(a + b) mod 2^m`` for reduced int64 tensors."""
    return (a + b) & modulus_mask(m)


def sub(a: Tensor, b: Tensor, m: int) -> Tensor:
    """``(a - b) mod 2^m`` for reduced int64 tensors."""
    return (a - b) & modulus_mask(m)


def to_signed(x: Tensor, m: int) -> Tensor:
    """The signed integers ``[-2^(m-1), 2^(m-1))`` that ring elements ``x`` represent."""
    r = reduce(x, m)
    return torch.where(r >= (1 << (m - 1)), r - (1 << m), r)


def stochastic_round(v: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """``floor(v + u)`` with ``u ~ U[0, 1)`` drawn from ``generator``: int64, ``E = v``."""
    v = v.to(torch.float64)
    u = torch.rand(v.shape, generator=generator, dtype=torch.float64, device=v.device)
    return torch.floor(v + u).to(torch.int64)


def encode(x: Tensor, *, m: int, frac_bits: int, generator: torch.Generator | None = None) -> Tensor:
    """Float tensor -> ring elements: ``floor(x 2^f + u) mod 2^m`` (int64, same shape).

    Computed in float64, so it is exact for ``|x| 2^f < 2^53``; values outside the signed
    range wrap (the caller clips first).
    """
    _check_bits(m)
    q = stochastic_round(x.to(torch.float64) * float(2**frac_bits), generator)
    return q & modulus_mask(m)


def decode(s: Tensor, *, m: int, frac_bits: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """Ring elements (e.g. a sum of :func:`encode` outputs) -> floats: ``signed(s) / 2^f``."""
    return (to_signed(s, m).to(torch.float64) / float(2**frac_bits)).to(dtype)


def packed_nbytes(n: int, m: int) -> int:
    """Bytes :func:`pack` writes for ``n`` elements of ``m`` bits: ``ceil(n m / 8)``."""
    return math.ceil(n * m / 8)


def pack(x: Tensor, m: int) -> Tensor:
    """Pack ``n`` ring elements (int64 in ``[0, 2^m)``, any shape, read flat) into
    ``uint8 [ceil(n m / 8)]``; bits above ``m`` are dropped."""
    _check_bits(m)
    flat = reduce(x.detach().reshape(-1).cpu(), m).numpy()
    n = flat.size
    if m % 8 == 0:
        # Whole bytes: the low m/8 bytes of each little-endian int64 are the element.
        raw = flat.astype("<i8", copy=False).view(np.uint8).reshape(n, 8)[:, : m // 8]
        return torch.from_numpy(np.ascontiguousarray(raw).reshape(-1))
    # General width: expand every element into its m bits (from its low ceil(m / 8)
    # bytes only, to keep the temporary small), then pack 8 bits a byte.
    low = flat.astype("<i8", copy=False).view(np.uint8).reshape(n, 8)[:, : -(-m // 8)]
    bits = np.unpackbits(low, axis=1, bitorder="little")[:, :m]  # [n, m]
    packed = np.packbits(bits.reshape(-1), bitorder="little")
    return torch.from_numpy(packed)


def unpack(buf: Tensor | bytes | bytearray | memoryview, m: int, n: int) -> Tensor:
    """Inverse of :func:`pack`: ``ceil(n m / 8)`` bytes -> int64 ``[n]`` in ``[0, 2^m)``."""
    _check_bits(m)
    if isinstance(buf, Tensor):
        raw = buf.detach().cpu().reshape(-1).to(torch.uint8).numpy()
    else:
        raw = np.frombuffer(bytes(buf), dtype=np.uint8)
    need = packed_nbytes(n, m)
    if raw.size != need:
        raise ValueError(f"expected {need} bytes for {n} elements of {m} bits, got {raw.size}")
    if m % 8 == 0:
        wide = np.zeros((n, 8), dtype=np.uint8)
        wide[:, : m // 8] = raw.reshape(n, m // 8)
        return torch.from_numpy(wide.reshape(-1).view("<i8").astype(np.int64))
    nb = -(-m // 8)
    bits = np.zeros((n, 8 * nb), dtype=np.uint8)
    bits[:, :m] = np.unpackbits(raw, bitorder="little")[: n * m].reshape(n, m)
    wide = np.zeros((n, 8), dtype=np.uint8)
    wide[:, :nb] = np.packbits(bits, axis=1, bitorder="little")
    return torch.from_numpy(wide.reshape(-1).view("<i8").astype(np.int64))
