"""Skip-when-unchanged halo rows (after SANCUS): resend a row only when it moved.

For each layer the sender keeps a mirror of what each receiver holds of its rows and the
age of that copy. In epoch t it resends row i when

    ||x_i - mirror_i|| > threshold * ||mirror_i||     or     age_i + 1 > max_age

so no receiver ever computes with a row older than ``max_age`` epochs (the bound). Which
rows follow is announced first as a bitmap (one bit per halo row, packed, counted); then
the rows go through the inner strategy. With ``residual_bits < 32`` the sender sends
``x_i - mirror_i`` quantized instead, and both sides add the same decoded residual, so
mirror and cache stay identical. (Around a quantized inner strategy without a residual,
the receiver holds the decoded row while the mirror holds the exact one, so the change
test ignores a row's quantization error; prefer ``residual_bits`` to combine the two.)
Gradients pass through unchanged. Guard epochs send every row exactly.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from commgnn.comm import quant
from commgnn.comm.halo.exchange import RowExchange, Wrapper
from commgnn.comm.halo.sampled import block_sums

def pack_bits(mask: Tensor, counts: list[int]) -> tuple[Tensor, list[int]]:
    """Pack a bool mask block by block (each block padded to whole bytes)."""
    blocks = [quant.pack_codes(b.view(1, -1).to(torch.uint8), 1).reshape(-1) for b in torch.split(mask.cpu(), counts)]
    return torch.cat(blocks), [b.numel() for b in blocks]


def unpack_bits(packed: Tensor, counts: list[int]) -> Tensor:
    nbytes = [(c + 7) // 8 for c in counts]
    return torch.cat([quant.unpack_codes(b.view(1, -1), 1, c).reshape(-1).bool()
                      for b, c in zip(torch.split(packed.cpu(), nbytes), counts)])


class SkipUnchanged(Wrapper):
    def __init__(self, inner: RowExchange, *, threshold: float, max_age: int, residual_bits: int,
                 seed: int) -> None:
        super().__init__(inner)
        self.threshold, self.max_age, self.residual_bits = threshold, max_age, residual_bits
        self.gen = torch.Generator().manual_seed(seed)
        self.mirror: dict[int, Tensor] = {}    # layer -> [S, d] what receivers hold of my rows
        self.send_age: dict[int, Tensor] = {}  # layer -> [S]
        self.cache: dict[int, Tensor] = {}     # layer -> [H, d] peers' rows as I hold them
        self.recv_age: dict[int, Tensor] = {}  # layer -> [H]
        self.max_age_used = 0
        """Oldest cached row any forward pass has used so far (<= max_age)."""
        self.rows_sent = self.rows_total = 0

    def move(self, rows: Tensor, out_counts: list[int], in_counts: list[int], layer: int,
             kind: str) -> Tensor:
        if kind != "halo_fwd":
            return self.inner.move(rows, out_counts, in_counts, layer, kind)
        self.rows_total += rows.shape[0]
        if self.exact_now or layer not in self.mirror or self.mirror[layer].shape != rows.shape:
            got = self.transport.move(rows, out_counts, in_counts, layer, kind)
            self.mirror[layer], self.cache[layer] = rows.detach().clone(), got.detach().clone()
            self.send_age[layer] = torch.zeros(rows.shape[0], dtype=torch.long, device=rows.device)
            self.recv_age[layer] = torch.zeros(got.shape[0], dtype=torch.long, device=rows.device)
            self.rows_sent += rows.shape[0]
            return got
        x = rows.detach()
        mirror = self.mirror[layer]
        change = (x - mirror).norm(dim=1)
        send = (change > self.threshold * mirror.norm(dim=1)) | (self.send_age[layer] + 1 > self.max_age)
        packed, sizes = pack_bits(send, out_counts)
        in_sizes = [(c + 7) // 8 for c in in_counts]
        got_bits = self.transport.move(packed.to(rows.device), sizes, in_sizes, layer, kind)
        recv = unpack_bits(got_bits, in_counts).to(rows.device)
        out_sent, in_sent = block_sums(send, out_counts), block_sums(recv, in_counts)
        cache = self.cache[layer]
        if self.residual_bits < 32:
            payload = quant.encode((x[send] - mirror[send]).cpu(), self.residual_bits, self.gen).to(rows.device)
            mirror[send] += quant.decode(payload, self.residual_bits, x.shape[1], x.dtype)
            got = self.transport.move(payload, out_sent, in_sent, layer, kind)
            cache[recv] += quant.decode(got, self.residual_bits, x.shape[1], cache.dtype)
        else:
            mirror[send] = x[send]
            cache[recv] = self.inner.move(x[send], out_sent, in_sent, layer, kind).to(cache.dtype)
        self.send_age[layer] = torch.where(send, 0, self.send_age[layer] + 1)
        self.recv_age[layer] = torch.where(recv, 0, self.recv_age[layer] + 1)
        if recv.numel():
            self.max_age_used = max(self.max_age_used, int(self.recv_age[layer].max()))
        self.rows_sent += int(send.sum())
        return cache.clone()

    def epoch_log(self) -> dict[str, Any]:
        log = {**super().epoch_log(), "skip_sent_frac": self.rows_sent / max(self.rows_total, 1),
               "max_age_used": self.max_age_used}
        self.rows_sent = self.rows_total = 0
        return log

    def own_state(self) -> dict[str, Any]:
        copy = {name: {k: v.clone() for k, v in getattr(self, name).items()}
                for name in ("mirror", "send_age", "cache", "recv_age")}
        return {**copy, "gen": self.gen.get_state(), "max_age_used": self.max_age_used}

    def load_own_state(self, state: dict[str, Any]) -> None:
        for name in ("mirror", "send_age", "cache", "recv_age"):
            setattr(self, name, {k: v.clone() for k, v in state[name].items()})
        self.gen.set_state(state["gen"])
        self.max_age_used = state["max_age_used"]
