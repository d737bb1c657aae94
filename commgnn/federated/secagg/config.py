"""``[secagg]`` (the class lives in :mod:`commgnn.federated.config`): secure aggregation of client updates (Bonawitz et al. 2017 / SecAgg+).

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

from commgnn.federated.config import SecAggConfig

__all__ = ["SecAggConfig"]
