"""Secure aggregation (Bonawitz et al. 2017, SecAgg+ of Bell et al. 2020) for federated
training: the server learns only the sum of the surviving clients' updates.

* :mod:`.ring` -- fixed-point floats in Z_{2^m} and bit packing of ring elements;
* :mod:`.shamir` -- t-of-n secret sharing over GF(2^521 - 1);
* :mod:`.masking` -- X25519 agreement, AES-CTR mask expansion, AES-GCM share messages;
* :mod:`.protocol` -- client/server state machines and the in-memory :func:`run_round`;
* :mod:`.config` -- the ``[secagg]`` config table.
"""

from __future__ import annotations

from commgnn.federated.secagg.config import SecAggConfig
from commgnn.federated.secagg.protocol import (
    CIPHERTEXT_BYTES,
    STEPS,
    AdvertiseKeys,
    KeyList,
    MaskedInput,
    RoundStats,
    SecAggClient,
    SecAggRefusal,
    SecAggServer,
    ShareDelivery,
    ShareKeys,
    UnmaskRequest,
    UnmaskResponse,
    neighbour_graph,
    run_round,
)
from commgnn.federated.secagg.ring import decode, encode, pack, packed_nbytes, unpack

__all__ = [
    "CIPHERTEXT_BYTES", "STEPS", "AdvertiseKeys", "KeyList", "MaskedInput", "RoundStats", "SecAggClient",
    "SecAggConfig", "SecAggRefusal", "SecAggServer", "ShareDelivery", "ShareKeys", "UnmaskRequest",
    "UnmaskResponse", "decode", "encode", "neighbour_graph", "pack", "packed_nbytes", "run_round", "unpack",
]
