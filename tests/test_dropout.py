"""The models' dropout: inverted dropout at the rate asked (to 2^-17), unbiased, a 1-byte
mask kept for backward, seeded by the global generator or a given one; the mask drawn 16 bits
at a time."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from commgnn.models.dropout import applied_rate, dropout, keep_mask


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


@pytest.mark.parametrize("p", [0.001, 0.1, 0.15, 0.45, 0.5, 0.9, 0.999])
def test_the_drop_rate_is_the_one_asked(p):
    """Over 2M entries the dropped fraction is within 5 binomial sigmas of p' = round(65536 p)
    / 65536, itself within 2^-17 of p."""
    assert abs(applied_rate(p) - p) <= 2.0 ** -17
    torch.manual_seed(11)
    n = 2_000_003  # not a multiple of 4: the last word's lanes are partly used
    dropped = float((~keep_mask((n,), p)).sum()) / n
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(dropped - applied_rate(p)) < 5 * sigma + 1e-12


def test_every_position_in_a_word_drops_alike_and_independently():
    """Lanes 0..3 of each 64-bit word (and so columns of a 4-wide row) each drop at rate p,
    with no correlation between neighbours: a bad lane (a constant or shared top bit) fails."""
    torch.manual_seed(5)
    keep = keep_mask((500_000, 4), 0.5).float()
    rates = 1 - keep.mean(0)
    assert torch.all((rates - 0.5).abs() < 5 * math.sqrt(0.25 / 500_000))
    corr = torch.corrcoef(keep.T)
    off = corr[~torch.eye(4, dtype=torch.bool)]
    assert off.abs().max() < 5 / math.sqrt(500_000)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("p", [0.1, 0.45, 0.5])
def test_values_and_gradient_are_the_masked_rows_scaled(dtype, p):
    """Kept entries are x / (1 - p'), dropped ones 0; the gradient is the upstream
    gradient on the same mask with the same scale. The mask is recovered by replaying the
    seed (and read off the output: x is Gaussian, so no kept entry is 0)."""
    x = torch.randn(257, 33, dtype=dtype, requires_grad=True)
    w = torch.randn(257, 33, dtype=dtype)
    torch.manual_seed(7)
    out = dropout(x, p, True)
    (g,) = torch.autograd.grad((out * w).sum(), x)
    torch.manual_seed(7)
    keep = keep_mask(x.shape, p)
    scale = 1.0 / (1.0 - applied_rate(p))
    assert torch.equal(out != 0, keep)
    assert torch.allclose(out, x.detach() * keep * scale, rtol=2 * torch.finfo(dtype).eps, atol=0)
    assert torch.allclose(g, w * keep * scale, rtol=2 * torch.finfo(dtype).eps, atol=0)
    assert out.dtype == dtype and 0 < (out == 0).sum() < out.numel()


def test_it_is_unbiased():
    """The mean of many draws tends to x: within 5 standard errors on every entry."""
    torch.manual_seed(2)
    x = torch.randn(64, 8, dtype=torch.float64)
    draws = torch.stack([dropout(x, 0.3, True) for _ in range(4000)])
    se = x.abs() * math.sqrt(0.3 / 0.7) / math.sqrt(4000)
    assert torch.all((draws.mean(0) - x).abs() < 5 * se + 1e-12)


def test_the_seed_fixes_the_mask_and_draws_advance_the_generator():
    x = torch.randn(100, 30)
    torch.manual_seed(3)
    a, b = dropout(x, 0.5, True), dropout(x, 0.5, True)
    torch.manual_seed(3)
    assert torch.equal(dropout(x, 0.5, True), a)
    assert not torch.equal(a, b)  # the second call drew new words


def test_a_given_generator_draws_the_mask_and_the_global_one_is_untouched():
    x = torch.randn(100, 30)
    torch.manual_seed(5)
    state = torch.get_rng_state()
    a = dropout(x, 0.5, True, generator=torch.Generator().manual_seed(7))
    assert torch.equal(torch.get_rng_state(), state)  # the global stream did not advance
    assert torch.equal(dropout(x, 0.5, True, generator=torch.Generator().manual_seed(7)), a)
    assert not torch.equal(dropout(x, 0.5, True, generator=torch.Generator().manual_seed(8)), a)
    torch.manual_seed(7)  # the same seed on the global generator: the same stream
    assert torch.equal(dropout(x, 0.5, True), a)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_generator_draws_the_mask_on_the_device():
    x = torch.randn(100, 30, device="cuda")
    state = torch.cuda.get_rng_state()
    a = dropout(x, 0.5, True, generator=torch.Generator(device="cuda").manual_seed(7))
    assert torch.equal(torch.cuda.get_rng_state(), state)
    assert torch.equal(dropout(x, 0.5, True, generator=torch.Generator(device="cuda").manual_seed(7)), a)
    kept = a != 0
    assert torch.allclose(a[kept], x[kept] / (1 - applied_rate(0.5)))


def test_it_keeps_a_bool_mask_where_f_dropout_keeps_float_noise():
    x = torch.randn(1000, 64, requires_grad=True)
    ours = _saved_bytes(lambda t: dropout(t, 0.5, True), x)
    theirs = _saved_bytes(lambda t: F.dropout(t, 0.5, True), x)
    assert ours == x.numel()          # one byte per element
    assert theirs == 4 * x.numel()    # F.dropout on CPU: the scaled float noise


def test_no_op_in_evaluation_at_p_zero_and_below_the_lane_resolution():
    x = torch.randn(5, 3)
    assert dropout(x, 0.5, False) is x
    assert dropout(x, 0.0, True) is x
    assert dropout(x, 2.0 ** -18, True) is x  # rounds to p' = 0: nothing to draw


@pytest.mark.parametrize("needs_input_grad", [True, False])
def test_a_projection_of_the_dropout_keeps_its_input_and_mask_only(needs_input_grad):
    """``dropout_projector``'s ``proj(dropped, W)`` equals ``F.linear(dropout(x), W)`` in value
    and gradient (the same mask), and keeps for backward only ``x`` and the bool mask (and
    the weight), not the dropped ``[n, d]`` float copy ``F.linear`` would keep."""
    from commgnn.models.dropout import dropout_projector
    x0 = torch.randn(600, 32)
    w = torch.randn(8, 32, requires_grad=True)
    outs, grads = [], []
    for fused in (True, False):
        x = x0.clone().requires_grad_(needs_input_grad)
        torch.manual_seed(3)
        if fused:
            h, proj = dropout_projector(x, 0.4, True)
        else:
            h, proj = dropout(x, 0.4, True), F.linear
        y = proj(h, w) + F.linear(h, w.detach() * 2)  # a second use of h through plain linear
        y.square().sum().backward()
        outs.append(y.detach())
        grads.append((w.grad.clone(), x.grad.clone() if needs_input_grad else None))
        w.grad = None
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)  # same mask, same arithmetic
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-6, atol=1e-5)
    if needs_input_grad:
        torch.testing.assert_close(grads[0][1], grads[1][1], rtol=1e-6, atol=1e-5)

    def kept(fused: bool) -> int:
        x = x0.clone().requires_grad_(True)
        seen: dict[int, int] = {}
        skip = {x.untyped_storage().data_ptr(), w.untyped_storage().data_ptr()}

        def pack(t: torch.Tensor) -> torch.Tensor:
            if t.untyped_storage().data_ptr() not in skip:
                seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            if fused:
                h, proj = dropout_projector(x, 0.4, True)
                proj(h, w)
            else:
                F.linear(dropout(x, 0.4, True), w)
        return sum(seen.values())
    assert kept(True) == x0.numel()  # the bool mask alone
    assert kept(False) == x0.numel() + 4 * x0.numel()  # the mask and the dropped float32 copy
    h, proj = dropout_projector(x0, 0.4, False)  # eval mode: no dropout, plain linear
    assert h is x0 and proj is F.linear
