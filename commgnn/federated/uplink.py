"""Uplink codecs for federated updates that still sum correctly under secure aggregation.

Secure aggregation (:mod:`commgnn.federated.secagg`) only adds integers modulo ``2^m``, so
a codec may compress an update only with maps every client shares: the same scale, the
same coordinate subset, the same projection. The server then decodes the *sum* once.
Every codec maps a flat float update ``[d]`` to ``d'`` signed integers (int64; secure
aggregation reduces them mod ``2^m``) and back:

* :class:`SharedScaleQuant` -- ``q = floor(clamp(x, -c, c) / s + u)``, ``s = c / (2^(b-1) - 1)``,
  ``u ~ U[0, 1)`` (unbiased inside the clip range). ``n`` clients' codes sum to at most
  ``n (2^(b-1) - 1)`` in magnitude, so the ring needs ``m = b + ceil(log2 n)`` bits and a
  masked update costs ``ceil(d m / 8)`` bytes.
* :class:`FixedPoint` -- the same with the ``[secagg]`` config's resolution
  ``2^-frac_bits`` and its fixed ``ring_bits``.
* :class:`RandomK` -- the ``k = round(f d)`` coordinates drawn from ``(seed, round)``
  (shared by all clients), quantised as above: ``ceil(k m / 8)`` bytes.
* :class:`RankR` -- per 2-D weight block ``M [rows, cols]`` (higher-rank blocks are viewed
  as ``[shape[0], rest]``) and round, a shared ``Q [cols, r]``; the client sends
  ``P = M Q`` and the server decodes ``(sum P) Q^T / r``. With error feedback ``Q`` is the
  orthonormalised Gaussian and the decode ``(sum P) Q^T`` (a projection: contractive, the
  residual carries the rest); without it ``Q`` is Gaussian and ``/ r`` makes it unbiased
  (``E[Q Q^T] = r I``). Unbiased-but-noisy projections must not feed error feedback:
  ``E|x - x Q Q^T / r|^2 ~ (cols / r) |x|^2`` would make the residual grow without bound.
  1-D blocks and blocks with ``cols <= r`` go dense. ``ceil(d' m / 8)`` bytes,
  ``d' = sum rows r + dense sizes``.
* :class:`Plain` -- float32, no secure aggregation: ``4 d`` bytes (the baseline).

RandomK and RankR keep a client-side error-feedback residual (what was not sent, plus
the clipping error; optionally damped, see :class:`_ErrorFeedback`), saved with
:meth:`state_dict`. Randomness is drawn from
``torch.Generator`` seeded by hashing ``(seed, purpose, round[, client])``: the shared
maps use only ``seed`` and the round; the rounding noise also mixes in ``client`` so
clients round independently.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

import torch
from torch import Tensor

from commgnn.config import fraction as check_fraction
from commgnn.config import positive
from commgnn.errors import ConfigError, UserError
from commgnn.federated.secagg import ring
from commgnn.federated.secagg.config import SecAggConfig
from commgnn.federated.secagg.masking import Entropy
from commgnn.federated.secagg.protocol import RoundStats, run_round


def clamped_count(codec: Any) -> int:
    """Values ``codec`` (or the quantiser inside it) has clipped so far; 0 for codecs that
    never clip."""
    return int(getattr(getattr(codec, "quant", codec), "clamped", 0))


def mixed_seed(*parts: object) -> int:
    """A 63-bit generator seed hashed from ``parts`` (stable across runs and platforms)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & ((1 << 63) - 1)


def _generator(*parts: object) -> torch.Generator:
    return torch.Generator().manual_seed(mixed_seed(*parts))


def _flat(update: Tensor, dim: int) -> Tensor:
    if update.numel() != dim:
        raise UserError(f"uplink update has {update.numel()} values, the codec was built for {dim}")
    return update.detach().reshape(-1).to(torch.float32).cpu()


@runtime_checkable
class UplinkCodec(Protocol):
    """What the federated trainer calls. ``n_clients`` is the cohort size the ring is
    sized for (not the survivors): encode and decode must agree on it."""

    secure: bool
    """True when :meth:`encode` yields integers for secure aggregation."""
    dim: int
    """d: values in one flat update."""
    out_dim: int
    """d': integers (or floats for :class:`Plain`) one client sends."""

    def encode(self, update: Tensor, round_id: int) -> Tensor: ...

    def decode_sum(self, sum_ring: Tensor, n_clients: int, round_id: int) -> Tensor: ...

    def ring_bits(self, n_clients: int) -> int: ...

    def payload_bytes(self, n_clients: int) -> int: ...

    def state_dict(self) -> dict[str, Tensor]: ...

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None: ...


class SharedScaleQuant:
    """Stochastic ``bits``-bit signed quantisation with one scale ``clip / (2^(bits-1) - 1)``
    for every client. ``client`` only seeds the rounding noise (give each client its own)."""

    secure = True

    def __init__(self, bits: int, clip: float, *, dim: int, seed: int = 0, client: int = 0) -> None:
        if not (isinstance(bits, int) and 2 <= bits <= 48):
            raise ConfigError(f"uplink quantisation bits must be an int in [2, 48], got {bits!r}")
        positive("uplink clip", clip)
        positive("uplink dim", dim)
        self.bits, self.clip, self.dim, self.out_dim = bits, float(clip), dim, dim
        self.seed, self.client = seed, client
        self.levels = (1 << (bits - 1)) - 1
        self.scale = self.clip / self.levels
        self.clamped = 0
        """Values this codec has clipped to ``[-clip, clip]`` so far (reported: a clipped
        value changes the sum the server decodes)."""

    def quantize(self, values: Tensor, round_id: int) -> Tensor:
        """Floats (any length) -> int64 codes in ``[-L, L]``, ``L = 2^(bits-1) - 1``."""
        self.clamped += int((values.abs() > self.clip).sum())
        v = values.to(torch.float64).clamp(-self.clip, self.clip) / self.scale
        q = ring.stochastic_round(v, _generator("round-noise", self.seed, self.client, round_id))
        return q.clamp_(-self.levels, self.levels)  # float error at +-clip must not leave the range

    def dequantize(self, codes: Tensor, n_clients: int) -> Tensor:
        """A sum of ``n_clients`` codes (mod ``2^ring_bits``) -> floats."""
        return (ring.to_signed(codes, self.ring_bits(n_clients)).to(torch.float64) * self.scale).to(torch.float32)

    def encode(self, update: Tensor, round_id: int) -> Tensor:
        return self.quantize(_flat(update, self.dim), round_id)

    def decode_sum(self, sum_ring: Tensor, n_clients: int, round_id: int) -> Tensor:
        return self.dequantize(sum_ring, n_clients)

    def ring_bits(self, n_clients: int) -> int:
        positive("number of clients", n_clients)
        m = self.bits + math.ceil(math.log2(n_clients))
        if m > ring.MAX_BITS:
            raise ConfigError(f"{self.bits}-bit codes for {n_clients} clients need a {m}-bit ring "
                              f"(max {ring.MAX_BITS}); lower bits")
        return m

    def payload_bytes(self, n_clients: int) -> int:
        return ring.packed_nbytes(self.out_dim, self.ring_bits(n_clients))

    def state_dict(self) -> dict[str, Tensor]:
        return {}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        pass


class FixedPoint(SharedScaleQuant):
    """The ``[secagg]`` config's encoding: ``floor(clamp(x, -clip, clip) 2^frac_bits + u)``
    in a ``ring_bits`` ring (checked against the cohort size)."""

    def __init__(self, config: SecAggConfig, *, dim: int, seed: int = 0, client: int = 0) -> None:
        positive("uplink dim", dim)
        self.config = config
        self.bits, self.clip, self.dim, self.out_dim = config.ring_bits, float(config.clip), dim, dim
        self.seed, self.client = seed, client
        self.scale = 2.0**-config.frac_bits
        self.levels = math.ceil(config.clip * 2.0**config.frac_bits)
        self.clamped = 0

    def ring_bits(self, n_clients: int) -> int:
        self.config.check_clients(n_clients)
        return self.config.ring_bits


class _ErrorFeedback:
    """Client-side residual ``e``: ``acc = update + e`` is compressed, ``e = beta (acc - sent)``.

    ``beta = 1`` is plain error feedback. ``beta < 1`` (a damped residual) forgets what was not
    sent at rate ``1 - beta`` per round, so the residual holds about ``1 / (1 - beta)`` rounds of
    updates instead of all of them: when a codec sends a small share of the update each round
    (rank 2 of 64 columns) the undamped residual grows until its release overshoots."""

    def __init__(self, dim: int, enabled: bool, decay: float = 1.0) -> None:
        if not 0.0 < decay <= 1.0:
            raise ConfigError(f"uplink residual decay must be in (0, 1], got {decay!r}")
        self.error_feedback = enabled
        self.decay = decay
        self.residual = torch.zeros(dim, dtype=torch.float32)

    def _accumulate(self, update: Tensor) -> Tensor:
        return update + self.residual if self.error_feedback else update

    def _keep(self, unsent: Tensor) -> None:
        """The new residual from what ``acc`` did not send."""
        self.residual = unsent if self.decay == 1.0 else self.decay * unsent

    def state_dict(self) -> dict[str, Tensor]:
        return {"residual": self.residual.clone()}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        res = state["residual"]
        if res.shape != self.residual.shape:
            raise UserError(f"uplink residual has shape {tuple(res.shape)}, expected {tuple(self.residual.shape)}")
        self.residual = res.detach().to(torch.float32).clone()


class RandomK(_ErrorFeedback):
    """Send ``k = max(1, round(fraction d))`` coordinates chosen per round from ``seed``
    (the same for all clients), quantised by a :class:`SharedScaleQuant`. With error
    feedback the rest stays in the residual; without it the sum is scaled by ``d / k``
    (unbiased)."""

    secure = True

    def __init__(self, fraction: float, *, dim: int, seed: int = 0, bits: int = 16, clip: float = 1.0,
                 client: int = 0, error_feedback: bool = True, residual_decay: float = 1.0) -> None:
        check_fraction("uplink random-k fraction", fraction, open_low=True)
        positive("uplink dim", dim)
        super().__init__(dim, error_feedback, residual_decay)
        self.fraction, self.dim, self.seed = fraction, dim, seed
        self.k = self.out_dim = max(1, round(fraction * dim))
        self.quant = SharedScaleQuant(bits, clip, dim=self.k, seed=seed, client=client)

    def indices(self, round_id: int) -> Tensor:
        """The round's shared coordinates, sorted: int64 ``[k]``."""
        perm = torch.randperm(self.dim, generator=_generator("random-k", self.seed, round_id))
        return perm[: self.k].sort().values

    def encode(self, update: Tensor, round_id: int) -> Tensor:
        acc = self._accumulate(_flat(update, self.dim))
        idx = self.indices(round_id)
        self.quant.clamped += int((acc[idx].abs() > self.quant.clip).sum())
        kept = acc[idx].clamp(-self.quant.clip, self.quant.clip)
        if self.error_feedback:
            unsent = acc.clone()
            unsent[idx] -= kept  # what was not sent, including the clipped excess
            self._keep(unsent)
        return self.quant.quantize(kept, round_id)

    def decode_sum(self, sum_ring: Tensor, n_clients: int, round_id: int) -> Tensor:
        out = torch.zeros(self.dim, dtype=torch.float32)
        vals = self.quant.dequantize(sum_ring, n_clients)
        out[self.indices(round_id)] = vals if self.error_feedback else vals * (self.dim / self.k)
        return out

    def ring_bits(self, n_clients: int) -> int:
        return self.quant.ring_bits(n_clients)

    def payload_bytes(self, n_clients: int) -> int:
        return self.quant.payload_bytes(n_clients)


class RankR(_ErrorFeedback):
    """Low-rank projection of each 2-D block with a shared per-round ``Q`` (see the module
    docstring), values quantised by a :class:`SharedScaleQuant`. ``shapes`` are the
    parameter shapes whose flattened concatenation is the update."""

    secure = True

    def __init__(self, rank: int, *, shapes: Sequence[Sequence[int]], seed: int = 0, bits: int = 16,
                 clip: float = 1.0, client: int = 0, error_feedback: bool = True,
                 residual_decay: float = 1.0) -> None:
        positive("uplink rank", rank)
        if not shapes:
            raise ConfigError("uplink rank-r codec needs the parameter shapes")
        self.rank, self.seed = int(rank), seed
        # (offset, numel, rows, cols) per block; cols = 0 marks a dense block.
        self.blocks: list[tuple[int, int, int, int]] = []
        off = out = 0
        for shape in shapes:
            numel = math.prod(shape)
            rows = shape[0] if len(shape) >= 2 else numel
            cols = numel // rows if len(shape) >= 2 and rows else 0
            low = cols > self.rank
            self.blocks.append((off, numel, rows, cols if low else 0))
            off += numel
            out += rows * self.rank if low else numel
        self.dim, self.out_dim = off, out
        super().__init__(self.dim, error_feedback, residual_decay)
        self.quant = SharedScaleQuant(bits, clip, dim=out, seed=seed, client=client)
        self._q_cache: tuple[int, list[Tensor | None]] | None = None

    def projections(self, round_id: int) -> list[Tensor | None]:
        """The round's shared ``Q [cols, r]`` per block (None for dense blocks)."""
        if self._q_cache is not None and self._q_cache[0] == round_id:
            return self._q_cache[1]
        qs: list[Tensor | None] = []
        for b, (_, _, _, cols) in enumerate(self.blocks):
            if not cols:
                qs.append(None)
                continue
            q = torch.randn(cols, self.rank, generator=_generator("rank-r", self.seed, round_id, b))
            qs.append(torch.linalg.qr(q).Q if self.error_feedback else q)
        self._q_cache = (round_id, qs)
        return qs

    def _lift(self, p: Tensor, q: Tensor) -> Tensor:
        """``P [rows, r]`` back to ``[rows, cols]``."""
        lifted = p @ q.T
        return lifted if self.error_feedback else lifted / self.rank

    def encode(self, update: Tensor, round_id: int) -> Tensor:
        acc = self._accumulate(_flat(update, self.dim))
        clip = self.quant.clip
        pieces, sent = [], []
        for (off, numel, rows, cols), q in zip(self.blocks, self.projections(round_id)):
            block = acc[off:off + numel]
            if q is None:
                self.quant.clamped += int((block.abs() > clip).sum())
                piece = block.clamp(-clip, clip)
                sent.append(piece)
            else:
                piece = block.view(rows, cols) @ q
                self.quant.clamped += int((piece.abs() > clip).sum())
                piece = piece.clamp(-clip, clip)
                sent.append(self._lift(piece, q).reshape(-1))
                piece = piece.reshape(-1)
            pieces.append(piece)
        if self.error_feedback:
            self._keep(acc - torch.cat(sent))
        return self.quant.quantize(torch.cat(pieces), round_id)

    def decode_sum(self, sum_ring: Tensor, n_clients: int, round_id: int) -> Tensor:
        vals = self.quant.dequantize(sum_ring, n_clients)
        out, pos = [], 0
        for (_, numel, rows, cols), q in zip(self.blocks, self.projections(round_id)):
            if q is None:
                out.append(vals[pos:pos + numel])
                pos += numel
            else:
                out.append(self._lift(vals[pos:pos + rows * self.rank].view(rows, self.rank), q).reshape(-1))
                pos += rows * self.rank
        return torch.cat(out)

    def ring_bits(self, n_clients: int) -> int:
        return self.quant.ring_bits(n_clients)

    def payload_bytes(self, n_clients: int) -> int:
        return self.quant.payload_bytes(n_clients)


class Plain:
    """float32 updates summed in the clear (no secure aggregation): ``4 d`` bytes."""

    secure = False

    def __init__(self, *, dim: int) -> None:
        positive("uplink dim", dim)
        self.dim = self.out_dim = dim

    def encode(self, update: Tensor, round_id: int) -> Tensor:
        return _flat(update, self.dim).clone()

    def decode_sum(self, sum_ring: Tensor, n_clients: int, round_id: int) -> Tensor:
        return sum_ring.to(torch.float32)

    def ring_bits(self, n_clients: int) -> int:
        return 32

    def payload_bytes(self, n_clients: int) -> int:
        return 4 * self.dim

    def state_dict(self) -> dict[str, Tensor]:
        return {}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        pass


def aggregate(codecs: Mapping[int, UplinkCodec], updates: Mapping[int, Tensor], *, round_id: int,
              threshold: int, drop_after_share: set[int] | frozenset[int] = frozenset(),
              drop_after_masking: set[int] | frozenset[int] = frozenset(), neighbours: int | None = None,
              graph_seed: int = 0, entropy: Entropy | None = None) -> tuple[Tensor, RoundStats | None]:
    """Encode every client's update with its own codec, sum them (securely when the codecs
    are ``secure``, via :func:`~commgnn.federated.secagg.protocol.run_round`) and decode
    the sum: float32 ``[d]`` over the clients that survived unmasking (``stats.u3``; all
    clients for :class:`Plain`, whose stats are None). The ring is sized for
    ``len(updates)`` clients. Drops are ignored for plain sums."""
    ids = sorted(updates)
    if set(ids) != set(codecs):
        raise UserError("aggregate needs one codec per client update")
    decoder = codecs[ids[0]]
    encoded = {u: codecs[u].encode(updates[u], round_id) for u in ids}
    n = len(ids)
    if not decoder.secure:
        return decoder.decode_sum(torch.stack([encoded[u] for u in ids]).sum(0), n, round_id), None
    m = decoder.ring_bits(n)
    kwargs = {} if entropy is None else {"entropy": entropy}
    total, stats = run_round({u: ring.reduce(encoded[u], m) for u in ids}, m=m, threshold=threshold,
                             drop_after_share=drop_after_share, drop_after_masking=drop_after_masking,
                             round_id=round_id, neighbours=neighbours, graph_seed=graph_seed, **kwargs)
    return decoder.decode_sum(total, n, round_id), stats
