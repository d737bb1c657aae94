"""Adaptive bit-widths (after AdaQP): bits per layer, direction and peer from the measured
variance of the messages and a byte budget, re-solved every k epochs.

Stochastic rounding of a row with range ``R`` at ``b`` bits adds variance at most
``d R^2 / (4 (2^b - 1)^2)``. From the rows it sent to each peer since the last solve, a
sender estimates that error ``V(block, b)`` and the bytes ``B(block, b)`` of every block
(layer, direction, peer) at b in {1, 2, 4, 8}. Errors are made *relative*: each block's
``V`` is divided by the energy ``sum ||row||^2`` of all rows of its (layer, direction),
because forward embeddings and backward gradients live on scales orders of magnitude
apart (with absolute variance the solver gave the backward gradients 2 bits and the
forward rows 8 on Computers). It then minimises ``sum V_rel`` subject to
``sum B <= budget``: all blocks start at 1 bit and the upgrade with the largest variance
cut per extra byte is taken while it fits (greedy on a convex-ish front). Receivers learn
the chosen widths through one small all-to-all of the bit table (counted as control).
Until the first solve every block uses 8 bits.

With a time budget ``budget_s`` (seconds of training halo exchange per epoch) the byte
budget of each solve is ``budget_s x`` the rate this rank's exchanges achieved since the
previous solve (bytes it sent over the wall time of its exchanges, stalls included): a
feedback loop on the measured network, not on a model of it. Each solve's byte budget and
the widths are in the epoch log (``metrics.jsonl``).

Under MaxK (:class:`~commgnn.comm.halo.maxk_rows.MaxKRows`) a sparse layer's rows travel as
k (index, value) pairs: the solver then sizes the k values of each row (``d`` = k in the
error bound) and counts the indices as a fixed cost per row (``fixed``), which no width
changes but which the budget must hold. MaxKRows uses this class's per-peer
:meth:`~AdaptiveQuantized.encode` / :meth:`~AdaptiveQuantized.decode` / :meth:`~AdaptiveQuantized.send`.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from commgnn.comm import quant
from commgnn.comm.halo.exchange import RowExchange, Wrapper
from commgnn.distributed.context import DistContext
from commgnn.distributed.events import Hooks

_DIRS = ("halo_fwd", "halo_bwd")
_STATE = ("send_bits", "recv_bits", "r2", "n2", "rows", "width")
_OPTIONAL_STATE = ("fixed",)  # absent from checkpoints written before MaxK composed
_TIMING = ("move_s", "move_bytes", "budget")


def solve_bits(stats: dict[tuple[int, int, int], tuple[float, int, int]], budget: float,
               fixed: dict[tuple[int, int, int], int] | None = None) -> dict:
    """Greedy bit allocation. ``stats[(layer, dir, peer)] = (sum of R^2 per row, rows, d)``
    (per epoch), ``fixed[block]`` bytes per row that travel at any width (MaxK's indices);
    returns ``{block: bits}`` whose bytes fit ``budget`` where possible."""
    ladder = quant.BITS
    bits = {k: ladder[0] for k in stats}
    fixed = fixed or {}

    def cost(k: tuple[int, int, int], b: int) -> float:
        _, rows, d = stats[k]
        return rows * (fixed.get(k, 0) + quant.bytes_per_row(d, b))

    def var(k: tuple[int, int, int], b: int) -> float:
        r2, _, d = stats[k]
        return d * r2 / (4 * ((1 << b) - 1) ** 2)

    spent = sum(cost(k, b) for k, b in bits.items())
    while True:
        best, best_gain = None, 0.0
        for k, b in bits.items():
            i = ladder.index(b)
            if i + 1 == len(ladder):
                continue
            nb = ladder[i + 1]
            extra = cost(k, nb) - cost(k, b)
            if spent + extra > budget:
                continue
            gain = (var(k, b) - var(k, nb)) / max(extra, 1e-9)
            if gain > best_gain:
                best, best_gain = (k, nb, extra), gain
        if best is None:
            return bits
        k, nb, extra = best
        bits[k] = nb
        spent += extra


def relative_stats(r2: Tensor, n2: Tensor, rows: Tensor, width: Tensor,
                   epochs: int) -> dict[tuple[int, int, int], tuple[float, int, int]]:
    """:func:`solve_bits` input from sums since the last solve (``[2 L, P]`` each: row
    range^2 ``r2``, row norm^2 ``n2``, row count; ``width`` ``[2 L]``), per epoch, with each
    block's ``R^2`` divided by the energy of its (layer, direction) over all peers."""
    stats = {}
    energy = n2.sum(dim=1)  # [2 L]
    for k in range(r2.shape[0]):
        for q in range(r2.shape[1]):
            if rows[k, q] > 0:
                rel = float(r2[k, q] / energy[k]) if energy[k] > 0 else 0.0
                stats[(k // 2, k % 2, q)] = (rel, int(rows[k, q] / epochs), int(width[k]))
    return stats


class AdaptiveQuantized(Wrapper):
    def __init__(self, inner: RowExchange, *, ctx: DistContext, hooks: Hooks, num_layers: int,
                 budget_bytes: float | None, every: int, seed: int, budget_s: float | None = None) -> None:
        super().__init__(inner)
        if (budget_bytes is None) == (budget_s is None):
            raise ValueError("give budget_bytes or budget_s")
        self.ctx, self.hooks, self.num_layers = ctx, hooks, num_layers
        self.budget, self.every, self.budget_s = budget_bytes or 0.0, every, budget_s
        self.move_s = 0.0       # wall time of training exchanges since the last solve
        self.move_bytes = 0.0   # bytes this rank sent in them
        self.gen = torch.Generator().manual_seed(seed)
        P = ctx.world_size
        K = 2 * num_layers
        self.send_bits = torch.full((K, P), 8, dtype=torch.long)  # [layer*2+dir, peer] mine
        self.recv_bits = torch.full((K, P), 8, dtype=torch.long)  # what peers use towards me
        self.r2 = torch.zeros(K, P, dtype=torch.float64)          # sum of row range^2 since solve
        self.rows = torch.zeros(K, P, dtype=torch.float64)
        self.n2 = torch.zeros(K, P, dtype=torch.float64)          # sum of row norm^2 since solve
        self.width = torch.zeros(K, dtype=torch.long)             # values per row (k under MaxK)
        self.fixed = torch.zeros(K, dtype=torch.long)             # bytes per row at any width
        self.epochs_seen = 0

    def set_epoch(self, epoch: int, exact: bool) -> None:
        if epoch > 0 and epoch % self.every == 0 and self.epochs_seen:
            self._resolve()
        if not exact:
            self.epochs_seen += 1  # this epoch's messages feed the next solve
        super().set_epoch(epoch, exact)

    def _resolve(self) -> None:
        if self.budget_s is not None and self.move_s > 0:
            self.budget = self.budget_s * self.move_bytes / self.move_s
        self.move_s = self.move_bytes = 0.0
        stats = relative_stats(self.r2, self.n2, self.rows, self.width, self.epochs_seen)
        fixed = {key: int(self.fixed[key[0] * 2 + key[1]]) for key in stats}
        for (layer, d, q), b in solve_bits(stats, self.budget, fixed).items():
            self.send_bits[layer * 2 + d, q] = b
        # receivers must decode with the sender's widths: column q of my table goes to q
        K, P = self.send_bits.shape
        if self.ctx.is_distributed:
            # on the collective's device: NCCL takes no CPU tensors
            send = self.send_bits.t().contiguous().reshape(-1).to(self.ctx.comm_device, torch.uint8)
            recv = torch.empty_like(send)
            self.hooks.sent("control", -1, -1, K * (P - 1))  # one byte per entry, K to each peer
            with self.hooks.timed("comm"):
                dist.all_to_all_single(recv, send, group=self.ctx.group)
            self.recv_bits = recv.view(P, K).t().contiguous().long().cpu()
        else:
            self.recv_bits = self.send_bits.clone()
        self.r2.zero_()
        self.n2.zero_()
        self.rows.zero_()
        self.epochs_seen = 0

    def move(self, rows: Tensor, out_counts: list[int], in_counts: list[int], layer: int,
             kind: str) -> Tensor:
        if self.exact_now or kind not in _DIRS or not rows.is_floating_point():  # eval, setup: exact
            return self.inner.move(rows, out_counts, in_counts, layer, kind)
        d = rows.shape[1]
        payloads = [p.reshape(-1) for p in self.encode(rows, out_counts, layer, kind)]
        out_bytes = [p.numel() for p in payloads]
        width = [self.row_bytes(layer, kind, d, q) for q in range(len(in_counts))]
        in_bytes = [c * w for c, w in zip(in_counts, width)]
        got = self.send(torch.cat(payloads).to(rows.device), out_bytes, in_bytes, layer, kind)
        chunks = [chunk.view(c, w) for chunk, c, w in zip(torch.split(got.cpu(), in_bytes), in_counts, width)]
        return self.decode(chunks, layer, kind, d, rows.dtype).to(rows.device)

    # The per-peer codec, shared with MaxKRows (which sends indices beside the values).
    def encode(self, rows: Tensor, out_counts: list[int], layer: int, kind: str, *,
               fixed_bytes: int = 0) -> list[Tensor]:
        """``rows [n, d]`` grouped by destination -> per peer q ``[out_counts[q],
        bytes_per_row(d, b_q)]`` uint8 codes (CPU) at this rank's width ``b_q`` for (layer,
        kind, q), after adding each block's range and energy to the next solve's statistics.
        ``fixed_bytes``: bytes per row the caller sends beside the codes (counted in the budget)."""
        k = layer * 2 + _DIRS.index(kind)
        self.width[k], self.fixed[k] = rows.shape[1], fixed_bytes
        blocks = []
        for q, block in enumerate(torch.split(rows.detach().cpu(), out_counts)):
            if block.shape[0]:
                rng = block.max(dim=1).values - block.min(dim=1).values
                self.r2[k, q] += float((rng.double() ** 2).sum())
                self.n2[k, q] += float((block.double() ** 2).sum())
                self.rows[k, q] += block.shape[0]
            blocks.append(quant.encode(block, int(self.send_bits[k, q]), self.gen))
        return blocks

    def row_bytes(self, layer: int, kind: str, d: int, peer: int) -> int:
        """Bytes of one row of width ``d`` that ``peer`` encodes towards this rank."""
        return quant.bytes_per_row(d, int(self.recv_bits[layer * 2 + _DIRS.index(kind), peer]))

    def decode(self, chunks: list[Tensor], layer: int, kind: str, d: int, dtype: torch.dtype) -> Tensor:
        """Per source peer q ``[n_q, row_bytes(q)]`` codes -> ``[sum n_q, d]`` values (CPU),
        each block decoded at the width its sender used."""
        k = layer * 2 + _DIRS.index(kind)
        return torch.cat([quant.decode(chunk, int(self.recv_bits[k, q]), d, dtype) for q, chunk in enumerate(chunks)])

    def send(self, payload: Tensor, out_bytes: list[int], in_bytes: list[int], layer: int, kind: str) -> Tensor:
        """Move encoded bytes, timing the move for a time budget's measured rate."""
        t0 = time.perf_counter()
        got = self.inner.move(payload, out_bytes, in_bytes, layer, kind)
        self.move_s += time.perf_counter() - t0
        self.move_bytes += sum(out_bytes)
        return got

    def epoch_log(self) -> dict[str, Any]:
        table = {f"{k // 2}.{'fwd' if k % 2 == 0 else 'bwd'}": self.send_bits[k].tolist()
                 for k in range(self.send_bits.shape[0]) if self.width[k] > 0}
        return {**super().epoch_log(), "bits": table, "bits_budget_bytes": self.budget}

    def own_state(self) -> dict[str, Any]:
        return {name: getattr(self, name).clone() for name in _STATE + _OPTIONAL_STATE} | {
            "epochs_seen": self.epochs_seen, "gen": self.gen.get_state()} | {
            name: getattr(self, name) for name in _TIMING}

    def load_own_state(self, state: dict[str, Any]) -> None:
        for name in _STATE + tuple(n for n in _OPTIONAL_STATE if n in state):
            # host-side bookkeeping: back on the CPU, wherever the state was loaded to
            setattr(self, name, state[name].to("cpu", copy=True))
        self.epochs_seen = state["epochs_seen"]
        self.gen.set_state(state["gen"])
        for name in _TIMING:
            if name in state:
                setattr(self, name, state[name])
