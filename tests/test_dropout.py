"""The models' dropout: F.dropout's values and gradients, with a 1-byte mask kept for backward."""

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
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_values_and_gradient_equal_f_dropout_bit_for_bit(dtype, p):
    x = torch.randn(257, 33, dtype=dtype, requires_grad=True)
    w = torch.randn(257, 33, dtype=dtype)
    torch.manual_seed(7)
    ref = F.dropout(x, p, True)
    (g_ref,) = torch.autograd.grad((ref * w).sum(), x)
    torch.manual_seed(7)
    out = dropout(x, p, True)
    (g,) = torch.autograd.grad((out * w).sum(), x)
    assert torch.equal(out, ref) and torch.equal(g, g_ref)
    assert 0 < (out == 0).sum() < out.numel()  # it did drop, and not everything


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
