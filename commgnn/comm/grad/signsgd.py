"""signSGD with error feedback (Karimireddy et al., ICML'19, "EF-SignSGD").

A rank sends ``scale * sign(p)`` for ``p = g + e``, with ``scale = ||p||_1 / n``: one bit
per entry (packed) plus one float32, and keeps ``e <- p - scale * sign(p)``.
"""

from __future__ import annotations

from torch import Tensor

import torch

from commgnn.comm import quant
from commgnn.comm.grad.compressed import CompressedSync, as_bytes


class SignSGDSync(CompressedSync):
    def encode(self, p: Tensor) -> Tensor:
        scale = p.abs().mean().reshape(1).to(torch.float32)
        bits = (p >= 0).to(torch.uint8).view(1, -1)
        return torch.cat([as_bytes(scale), quant.pack_codes(bits, 1).reshape(-1)])

    def decode(self, payload: Tensor, n: int) -> Tensor:
        scale = payload[:4].clone().view(torch.float32)
        bits = quant.unpack_codes(payload[4:].view(1, -1), 1, n).reshape(-1).to(torch.float32)
        return scale * (2 * bits - 1)
