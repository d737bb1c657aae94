"""QSGD (Alistarh et al., NeurIPS'17): stochastic quantization to ``s`` levels per bucket.

The vector is cut into buckets of ``bucket`` entries; entry ``v_i`` of a bucket with norm
``||v||_2`` becomes ``sign(v_i) ||v|| l_i / s`` with ``l_i = floor(|v_i| s / ||v|| + u)``,
``u ~ U[0, 1)``, so the estimate is unbiased. Each entry travels as the code
``2 l_i + [v_i < 0]`` in ``b`` bits (the smallest of 2, 4, 8 that holds ``2 s + 1``), packed,
plus one float32 norm per bucket. Being unbiased, QSGD runs without error feedback unless
asked for it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from commgnn.comm import quant
from commgnn.comm.grad.compressed import CompressedSync, as_bytes
from commgnn.distributed.context import DistContext
from commgnn.distributed.events import Hooks


def code_bits(levels: int) -> int:
    need = math.ceil(math.log2(2 * levels + 2))
    for b in (2, 4, 8):
        if need <= b:
            return b
    raise ValueError(f"QSGD levels must be <= 127, got {levels}")


class QSGDSync(CompressedSync):
    def __init__(self, ctx: DistContext, hooks: Hooks, *, levels: int, bucket: int = 512,
                 error_feedback: bool = False, seed: int = 0) -> None:
        super().__init__(ctx, hooks, seed=seed)
        self.levels, self.bucket, self.error_feedback = levels, bucket, error_feedback
        self.bits = code_bits(levels)

    def _buckets(self, n: int) -> int:
        return math.ceil(n / self.bucket)

    def encode(self, v: Tensor) -> Tensor:
        n, B = v.numel(), self.bucket
        nb = self._buckets(n)
        padded = torch.cat([v, v.new_zeros(nb * B - n)]).view(nb, B)
        norms = padded.norm(dim=1)
        safe = torch.where(norms > 0, norms, torch.ones_like(norms))
        u = torch.rand(padded.shape, generator=self.gen)
        lev = torch.floor(padded.abs() / safe[:, None] * self.levels + u).clamp_(0, self.levels)
        codes = (lev.to(torch.uint8) << 1) | (padded < 0).to(torch.uint8)
        return torch.cat([as_bytes(norms.to(torch.float32)), quant.pack_codes(codes, self.bits).reshape(-1)])

    def decode(self, payload: Tensor, n: int) -> Tensor:
        nb, B = self._buckets(n), self.bucket
        norms = payload[: 4 * nb].clone().view(torch.float32)
        codes = quant.unpack_codes(payload[4 * nb:].view(nb, -1), self.bits, B)
        lev = (codes >> 1).to(torch.float32)
        sign = 1 - 2 * (codes & 1).to(torch.float32)
        return (sign * lev * norms[:, None] / self.levels).reshape(-1)[:n]
