"""Dropout with a 1-byte mask kept for backward, and a CPU mask drawn 16 bits at a time.

    y = x * keep / q,    keep_ij ~ Bernoulli(q),   q = 1 - p'        x, y: any shape

**Memory.** On CPU, ``F.dropout`` computes ``x * noise`` with a float ``noise`` tensor
(``noise_ij = 0`` or ``1 / (1 - p)``), and autograd saves that tensor for the backward pass:
4 bytes per element (8 in float64) held from the forward to the backward pass, for every
dropout of the model. Here autograd keeps the ``bool`` mask instead: 32 MB rather than
128 MB for a ``[250k, 128]`` float32 activation.

**Speed (CPU).** ``F.dropout`` and ``torch.native_dropout`` draw one Bernoulli variate per
element from the generator (one 32-bit Mersenne-Twister word and a float compare each). Here
one 64-bit word of the same generator (``random_`` over int64's whole range) gives four
16-bit lanes, and an element is kept when its lane is at least ``t = round(65536 p)`` (as
unsigned): a quarter of the draws, and no float per element. The rate that is applied is
``p' = t / 65536``, within ``2^-17`` of ``p`` (p = 0.5 exactly), and kept values are scaled
by ``1 / (1 - p')``, so ``E[y] = x`` exactly. Measured in ``benchmarks/dropout.py``.

The mask is drawn from torch's global CPU generator, as before, so a seed and a
checkpointed generator state still fix it (resumes stay exact); a caller with its own stream
(a federated client's generator) passes it instead. It is a different stream
from ``F.dropout``'s: the same seed drops other entries. On CUDA, ``torch.native_dropout``
(which ``F.dropout`` uses there, with a bool mask, from the device's Philox generator) is
kept as it is: ``F.dropout``'s mask and values. Given a generator, CUDA takes the 16-bit-lane
path too (rate ``p'``), since ``native_dropout`` draws from the device's global generator only.

Written here: torch has no dropout that draws fewer than one generator word per element.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

_LANES = 1 << 16  # one mask decision per 16-bit lane


class _KeepScale(torch.autograd.Function):
    """``y = x * keep * scale`` with only the ``bool`` ``keep`` saved: ``dx = dy * keep * scale``."""

    @staticmethod
    def forward(fctx: Any, x: Tensor, keep: Tensor, scale: float) -> Tensor:  # type: ignore[override]
        fctx.save_for_backward(keep)
        fctx.scale = scale
        # through a uint8 view of the mask: float * bool takes a slow promotion path on the
        # CPU (9x slower than float * uint8 for [1719, 767] rows), float * uint8 does not
        return x.mul(keep.view(torch.uint8)).mul_(scale)

    @staticmethod
    def backward(fctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        (keep,) = fctx.saved_tensors
        return grad.mul(keep.view(torch.uint8)).mul_(fctx.scale), None, None


class _DropLinear(torch.autograd.Function):
    """``y = (x * keep * scale) W^T`` keeping ``x``, ``keep`` and ``W`` for backward, not the
    dropped ``x``: ``dW = dy^T (x * keep * scale)`` (recomputed), ``dx = (dy W) * keep * scale``.

    ``F.linear`` of a dropout's output keeps that output (4 bytes an element) until the
    backward pass. Where ``x`` is kept anyway (ReLU keeps its output; the input features
    persist) and the mask is the dropout's own, this keeps nothing more: GraphSAGE's root
    term ``W_r dropout(h)`` was 0.87 GB a rank of the products-sized graph's 3 x 128 model."""

    @staticmethod
    def forward(fctx: Any, x: Tensor, keep: Tensor, scale: float, weight: Tensor) -> Tensor:  # type: ignore[override]
        fctx.save_for_backward(x, keep, weight)
        fctx.scale = scale
        return torch.nn.functional.linear(x.mul(keep.view(torch.uint8)).mul_(scale), weight)

    @staticmethod
    def backward(fctx: Any, grad: Tensor) -> tuple[Tensor | None, None, None, Tensor | None]:  # type: ignore[override]
        x, keep, weight = fctx.saved_tensors
        k = keep.view(torch.uint8)
        dx = grad.mm(weight).mul_(k).mul_(fctx.scale) if fctx.needs_input_grad[0] else None
        dw = grad.t().mm(x.mul(k).mul_(fctx.scale)) if fctx.needs_input_grad[3] else None
        return dx, None, None, dw


def dropout_projector(x: Tensor, p: float, training: bool,
                      generator: torch.Generator | None = None) -> tuple[Tensor, Any]:
    """``(dropout(x), proj)``: the dropout of :func:`dropout` and a projector
    ``proj(t, W) = t W^T`` that, given that very output, computes it by :class:`_DropLinear`
    from ``x`` and the mask (no dropped copy kept for backward); for any other ``t``, or
    where the mask is not ours (CUDA's ``native_dropout``, eval mode), plain ``F.linear``.
    ``x`` is ``[n, d]``."""
    linear = torch.nn.functional.linear
    if not training or p == 0.0 or (x.device.type == "cuda" and generator is None) or x.dim() != 2:
        return dropout(x, p, training, generator), linear
    q = 1.0 - applied_rate(p)
    if q in (0.0, 1.0):
        return dropout(x, p, training, generator), linear
    keep, scale = keep_mask(x.shape, p, x.device, generator), 1.0 / q
    dropped = _KeepScale.apply(x, keep, scale)

    def proj(t: Tensor, weight: Tensor) -> Tensor:
        return _DropLinear.apply(x, keep, scale, weight) if t is dropped else linear(t, weight)
    return dropped, proj


def applied_rate(p: float) -> float:
    """The drop rate the CPU path applies for a requested ``p``: ``round(65536 p) / 65536``."""
    return round(p * _LANES) / _LANES


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, device: torch.device | None = None,
              generator: torch.Generator | None = None) -> Tensor:
    """A ``bool`` tensor of ``shape``, each entry True with probability ``1 - applied_rate(p)``,
    from four 16-bit lanes of each 64-bit draw of ``generator`` (default: the global one)."""
    n = 1
    for s in shape:
        n *= s
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=device)
    words.random_(-(1 << 63), None, generator=generator)  # the whole int64 range: 64 uniform bits a word
    lanes = words.view(torch.int16)[:n]  # uniform over -32768..32767
    # P(lane >= t - 32768) = (65536 - t) / 65536 = 1 - p'
    return (lanes >= round(p * _LANES) - 32768).view(shape)


def dropout(x: Tensor, p: float, training: bool, generator: torch.Generator | None = None) -> Tensor:
    """Inverted dropout of ``x`` (any shape) at rate ``p`` in ``[0, 1)``, with a bool mask
    saved for the backward pass (see the module docstring for the CPU rate ``p'``).
    ``generator`` (on ``x``'s device) draws the mask instead of the global generator; on CUDA
    it takes the 16-bit-lane path too, since ``native_dropout`` draws from the global one only."""
    if not training or p == 0.0:
        return x
    if x.device.type == "cuda" and generator is None:
        return torch.native_dropout(x, p, True)[0]
    q = 1.0 - applied_rate(p)
    if q == 1.0:  # p below 2^-17: nothing is dropped
        return x
    if q == 0.0:  # p above 1 - 2^-17: everything is
        return x * 0.0
    return _KeepScale.apply(x, keep_mask(x.shape, p, x.device, generator), 1.0 / q)
