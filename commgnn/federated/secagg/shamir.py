"""Shamir t-of-n secret sharing over the prime field GF(2^521 - 1).

Hand-written: ``cryptography`` has no secret sharing, and no maintained library offers it
over a field large enough for 32-byte keys without extra dependencies. The scheme is the
textbook one and small enough to check by eye.

A secret ``s < p`` (``p = 2^521 - 1``, a Mersenne prime, so any 32-byte secret is one
field element) is the constant term of a random polynomial of degree ``t - 1``::

    f(z) = s + a_1 z + ... + a_{t-1} z^{t-1}   (mod p),  a_i uniform in GF(p)

and the share of the party with x-coordinate ``x != 0`` is ``(x, f(x))``. Any ``t``
shares determine ``f`` and hence ``s = f(0)`` by Lagrange interpolation at 0::

    s = sum_j y_j prod_{k != j} x_k / (x_k - x_j)   (mod p)

while ``t - 1`` shares are consistent with every secret (information-theoretic secrecy).
Secure aggregation uses ``x = client id + 1``. A share's y value serialises to
:data:`SHARE_BYTES` (66) big-endian bytes.
"""

from __future__ import annotations

import os
from typing import Callable, Iterable, Sequence

PRIME = (1 << 521) - 1
"""The field modulus: the Mersenne prime 2^521 - 1."""

SHARE_BYTES = 66
"""Bytes of one serialised share value (521 bits rounded up to whole bytes)."""

SECRET_BYTES = 32
"""Secrets shared by secure aggregation are 32-byte seeds and X25519 private keys."""

Entropy = Callable[[int], bytes]
"""A source of random bytes (``os.urandom`` by default; a seeded one in tests)."""


def _uniform(entropy: Entropy) -> int:
    """A uniform element of GF(p) by rejection sampling 521-bit draws."""
    while True:
        v = int.from_bytes(entropy(SHARE_BYTES), "big") & PRIME  # keep the low 521 bits
        if v < PRIME:
            return v


def split(secret: bytes | int, xs: Sequence[int], threshold: int, *,
          entropy: Entropy = os.urandom) -> dict[int, int]:
    """Shares ``{x: f(x)}`` of ``secret`` for the x-coordinates ``xs`` (distinct, non-zero),
    any ``threshold`` of which reconstruct it."""
    s = int.from_bytes(secret, "big") if isinstance(secret, (bytes, bytearray)) else int(secret)
    if not 0 <= s < PRIME:
        raise ValueError("secret does not fit the field GF(2^521 - 1)")
    if len(set(xs)) != len(xs) or any(x % PRIME == 0 for x in xs):
        raise ValueError("share x-coordinates must be distinct and non-zero")
    if not 1 <= threshold <= len(xs):
        raise ValueError(f"threshold must lie in [1, {len(xs)}] for {len(xs)} shares, got {threshold}")
    coeffs = [s] + [_uniform(entropy) for _ in range(threshold - 1)]
    shares = {}
    for x in xs:
        y = 0
        for c in reversed(coeffs):  # Horner
            y = (y * x + c) % PRIME
        shares[x] = y
    return shares


def reconstruct(shares: dict[int, int] | Iterable[tuple[int, int]]) -> int:
    """``f(0)`` from shares ``{x: y}`` by Lagrange interpolation (uses all given shares;
    pass exactly ``threshold`` of them, or more that lie on the same polynomial)."""
    pts = list(shares.items()) if isinstance(shares, dict) else list(shares)
    xs = [x % PRIME for x, _ in pts]
    if not pts:
        raise ValueError("no shares to reconstruct from")
    if len(set(xs)) != len(xs) or 0 in xs:
        raise ValueError("share x-coordinates must be distinct and non-zero")
    secret = 0
    for j, (xj, yj) in enumerate(pts):
        num, den = 1, 1
        for k, (xk, _) in enumerate(pts):
            if k != j:
                num = num * xk % PRIME
                den = den * (xk - xj) % PRIME
        secret = (secret + yj * num * pow(den, -1, PRIME)) % PRIME
    return secret


def secret_to_bytes(secret: int, length: int = SECRET_BYTES) -> bytes:
    """A reconstructed field element back to its ``length``-byte secret; raises if it does
    not fit (wrong or too few shares give a random field element, almost never small)."""
    if secret >= 1 << (8 * length):
        raise ValueError(f"reconstructed value is not a {length}-byte secret (wrong or too few shares)")
    return secret.to_bytes(length, "big")


def share_to_bytes(y: int) -> bytes:
    """A share value as :data:`SHARE_BYTES` big-endian bytes."""
    return y.to_bytes(SHARE_BYTES, "big")


def share_from_bytes(b: bytes) -> int:
    """Inverse of :func:`share_to_bytes`."""
    if len(b) != SHARE_BYTES:
        raise ValueError(f"a share is {SHARE_BYTES} bytes, got {len(b)}")
    return int.from_bytes(b, "big")
