"""Dropout whose backward keeps a 1-byte mask.

On CPU, ``F.dropout`` computes ``x * noise`` with a float ``noise`` tensor (``noise_ij = 0``
or ``1 / (1 - p)``), and autograd saves that tensor for the backward pass: 4 bytes per
element (8 in float64) held from the forward to the backward pass, for every dropout of
the model. ``torch.native_dropout``, which ``F.dropout`` already uses on CUDA, draws the
same Bernoulli stream on CPU (the same mask under the same generator state) and saves a
``bool`` mask instead: 32 MB rather than 128 MB for a ``[250k, 128]`` float32 activation.
The kept values can differ from ``F.dropout``'s by an ulp or two: it scales by
``1 / (1 - p)`` rounded to float32 first, ``native_dropout`` by the double (p = 0.5, the
models' default, is exact either way; 15 of the 99 values p = 0.01 ... 0.99 differ).
"""

from __future__ import annotations

import torch
from torch import Tensor


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """``F.dropout(x, p, training)`` (the same mask; values within two float ulps), with a
    bool mask saved for the backward pass.

    ``x``: any shape. ``p`` in ``[0, 1)``.
    """
    if not training or p == 0.0:
        return x
    return torch.native_dropout(x, p, True)[0]
