"""The models' dropout: F.dropout's mask, values and gradients, with a 1-byte mask kept for backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from commgnn.models.dropout import dropout


def _saved_bytes(fn, x: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd keeps for ``fn(x)``'s backward (``x`` itself excluded)."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() != x.untyped_storage().data_ptr():
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(x)
    return sum(seen.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("p", [0.1, 0.15, 0.45, 0.5, 0.9])
def test_mask_values_and_gradient_match_f_dropout(dtype, p):
    """The same mask under the same generator state; values and gradients within
    two ulps (F.dropout rounds 1 / (1 - p) to the dtype first: p = 0.15 and 0.45 differ in float32)."""
    x = torch.randn(257, 33, dtype=dtype, requires_grad=True)
    w = torch.randn(257, 33, dtype=dtype)
    torch.manual_seed(7)
    ref = F.dropout(x, p, True)
    (g_ref,) = torch.autograd.grad((ref * w).sum(), x)
    torch.manual_seed(7)
    out = dropout(x, p, True)
    (g,) = torch.autograd.grad((out * w).sum(), x)
    assert torch.equal(out == 0, ref == 0) and torch.equal(g == 0, g_ref == 0)
    ulp = 2 * torch.finfo(dtype).eps  # two roundings: of the scale, then of the product
    assert torch.allclose(out, ref, rtol=ulp, atol=0) and torch.allclose(g, g_ref, rtol=ulp, atol=0)
    assert 0 < (out == 0).sum() < out.numel()  # it did drop, and not everything


def test_the_default_rate_is_bit_for_bit():
    x = torch.randn(300, 40, requires_grad=True)
    torch.manual_seed(3)
    ref = F.dropout(x, 0.5, True)
    torch.manual_seed(3)
    assert torch.equal(dropout(x, 0.5, True), ref)


def test_it_keeps_a_bool_mask_where_f_dropout_keeps_float_noise():
    x = torch.randn(1000, 64, requires_grad=True)
    ours = _saved_bytes(lambda t: dropout(t, 0.5, True), x)
    theirs = _saved_bytes(lambda t: F.dropout(t, 0.5, True), x)
    assert ours == x.numel()          # one byte per element
    assert theirs == 4 * x.numel()    # F.dropout on CPU: the scaled float noise


def test_no_op_in_evaluation_and_at_p_zero():
    x = torch.randn(5, 3)
    assert dropout(x, 0.5, False) is x
    assert dropout(x, 0.0, True) is x
