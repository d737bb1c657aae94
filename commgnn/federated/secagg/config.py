"""``[secagg]``: secure aggregation of client updates (Bonawitz et al. 2017 / SecAgg+).

Example::

    [secagg]
    enabled = true
    threshold = 6        # a client count (> 1) or a fraction of the clients (<= 1, rounded up); default 2/3
    ring_bits = 32       # sums are computed modulo 2^ring_bits
    frac_bits = 16       # fixed point: a coordinate x travels as round(x 2^frac_bits)
    clip = 1.0           # coordinates are clipped to [-clip, clip] before encoding
    neighbours = 0       # SecAgg+: masks/shares only with k graph neighbours; 0 = all

The ring must hold the sum of every client's largest coordinate:
``n (clip 2^frac_bits + 1) < 2^(ring_bits - 1)`` (the +1 is stochastic rounding);
:meth:`SecAggConfig.check_clients` enforces it once the number of clients is known.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from commgnn.config import fraction, positive
from commgnn.errors import ConfigError
from commgnn.federated.secagg.ring import MAX_BITS


@dataclass(frozen=True, kw_only=True)
class SecAggConfig:
    """Secure aggregation: threshold, ring and fixed-point encoding."""

    enabled: bool = False
    """Mask every client update so the server learns only the sum of the survivors."""
    threshold: float = 2 / 3
    """Shamir threshold t: at least t clients must survive to the unmasking step, and
    fewer than t colluding clients (with the server) learn nothing about one update. A
    value <= 1 is a fraction of the clients (of a client's neighbourhood of
    ``neighbours + 1`` with SecAgg+), rounded up; a value > 1 is a client count (an
    integer). The default, ceil(2n/3), lets a third of the clients drop out. t must exceed
    half the group: with t <= n/2 a server that tells two halves different survivor sets
    could collect both a client's self-mask and its pairwise-mask shares. Against a server
    colluding with c clients the protocol needs 2t > n + c (Bonawitz et al. 2017), which
    the default meets for c < n/3."""
    ring_bits: int = 32
    """Bits m of the ring Z_{2^m} that masked sums live in (2 to 62)."""
    frac_bits: int = 16
    """Fractional bits of the fixed-point encoding (resolution 2^-frac_bits)."""
    clip: float = 1.0
    """Bound per coordinate: values are clipped to [-clip, clip] before encoding."""
    neighbours: int = 0
    """SecAgg+ (Bell et al. 2020): each client masks with and shares its keys among only
    this many neighbours of a random regular graph (cost O(k) instead of O(n) per client);
    0 = every client (classic SecAgg)."""

    def __post_init__(self) -> None:
        if self.threshold > 1:
            if self.threshold != int(self.threshold):
                raise ConfigError(f"secagg.threshold > 1 is a client count and must be an integer, "
                                  f"got {self.threshold}")
        else:
            fraction("secagg.threshold", self.threshold, open_low=True)
        if not 2 <= self.ring_bits <= MAX_BITS:
            raise ConfigError(f"secagg.ring_bits must lie in [2, {MAX_BITS}], got {self.ring_bits}")
        positive("secagg.frac_bits", self.frac_bits, allow_zero=True)
        if self.frac_bits >= self.ring_bits - 1:
            raise ConfigError(f"secagg.frac_bits ({self.frac_bits}) must be below secagg.ring_bits - 1 "
                              f"({self.ring_bits - 1})")
        positive("secagg.clip", self.clip)
        positive("secagg.neighbours", self.neighbours, allow_zero=True)
        if self.neighbours == 1:
            raise ConfigError("secagg.neighbours must be 0 (all clients) or >= 2")
        top = self.clip * 2.0**self.frac_bits + 1
        if top >= 2.0**53:
            raise ConfigError(f"secagg.clip * 2^frac_bits = {top - 1:.3g} exceeds float64 precision (2^53); "
                              f"lower clip or frac_bits")
        if top >= 2.0 ** (self.ring_bits - 1):
            raise ConfigError(
                f"secagg.ring_bits = {self.ring_bits} cannot hold even one client: clip * 2^frac_bits + 1 = {top:.6g} "
                f">= 2^{self.ring_bits - 1}; raise ring_bits or lower clip / frac_bits")

    def group_size(self, n_clients: int) -> int:
        """Clients a threshold applies to: all ``n`` or, with SecAgg+, a neighbourhood."""
        if self.neighbours and self.neighbours < n_clients - 1:
            return self.neighbours + 1
        return n_clients

    def threshold_count(self, n_clients: int) -> int:
        """The Shamir threshold t for ``n_clients`` (see :attr:`threshold`)."""
        group = self.group_size(n_clients)
        if self.threshold > 1:
            t = int(self.threshold)
        else:
            t = max(1, math.ceil(self.threshold * group - 1e-9))
        what = "neighbourhood" if group < n_clients else "clients"
        if t > group:
            raise ConfigError(f"secagg.threshold = {self.threshold:g} asks for {t} shares but there are only "
                              f"{group} {what}; lower it")
        if 2 * t <= group:
            raise ConfigError(f"secagg.threshold = {self.threshold:g} gives t = {t} of {group} {what}, not above "
                              f"half: a deviating server could then unmask one client's update; raise it "
                              f"(the default is 2/3)")
        return t

    def check_clients(self, n_clients: int) -> None:
        """Raise a :class:`ConfigError` if ``n_clients`` updates cannot be summed exactly in
        the ring or the threshold does not fit them."""
        positive("number of secure-aggregation clients", n_clients)
        need = n_clients * (self.clip * 2.0**self.frac_bits + 1)
        if need >= 2.0 ** (self.ring_bits - 1):
            bits = math.floor(math.log2(need)) + 2
            raise ConfigError(
                f"secagg.ring_bits = {self.ring_bits} too small for {n_clients} clients: "
                f"n * (clip * 2^frac_bits + 1) = {need:.6g} must stay below 2^{self.ring_bits - 1}; "
                f"set ring_bits >= {bits} or lower clip / frac_bits")
        self.threshold_count(n_clients)
