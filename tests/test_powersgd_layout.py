"""PowerSGD's state follows DDP's bucket order (commgnn/comm/grad/powersgd_layout.py).

The end-to-end check is ``test_resume.py``'s powersgd case (a crash and resume while
compressing, step for step against the uninterrupted run); these check the layout itself
against what torch's hook allocates."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from commgnn.comm.grad.powersgd_layout import bucket_segments, permute_state

# W1 (4x3), b1, W2 (5x4), W3 (4x3): W1 and W3 share a shape, so their P/Q factors are
# grouped together ahead of W2's, whatever lies between them in the bucket.
SHAPES = {0: torch.Size([4, 3]), 1: torch.Size([4]), 2: torch.Size([5, 4]), 3: torch.Size([4, 3])}


def test_segments_follow_the_hooks_allocation():
    seg = bucket_segments([0, 1, 2, 3], SHAPES, rank=1, min_compression_rate=1.0)
    assert seg.error == {0: (0, 12), 1: (12, 4), 2: (16, 20), 3: (36, 12)}
    # the bias is not compressed; P groups by shape in order of first appearance
    assert seg.p == {0: (0, 4), 3: (4, 4), 2: (8, 5)}
    assert seg.q == {0: (0, 3), 3: (3, 3), 2: (6, 4)}
    # a rebuilt (reversed) bucket: W3 first, so the (4, 3) group still leads, W3 before W1
    rev = bucket_segments([3, 2, 1, 0], SHAPES, rank=1, min_compression_rate=1.0)
    assert rev.error == {3: (0, 12), 2: (12, 20), 1: (32, 4), 0: (36, 12)}
    assert rev.p == {3: (0, 4), 0: (4, 4), 2: (8, 5)}


def test_segment_totals_equal_what_torchs_hook_allocates():
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

    for rank in (1, 2, 3):
        seg = bucket_segments([2, 0, 1, 3], SHAPES, rank=rank, min_compression_rate=2.0)
        want_p = want_q = 0
        for s in SHAPES.values():
            n, m = s[0], s.numel() // s[0]
            r = min(n, m, rank)
            if _should_compress(n, m, r, 2.0)[0]:
                want_p, want_q = want_p + n * r, want_q + m * r
        assert sum(n for _, n in seg.p.values()) == want_p
        assert sum(n for _, n in seg.q.values()) == want_q


def test_permuting_moves_each_parameters_state_and_back():
    a, b = [0, 1, 2, 3], [3, 2, 1, 0]
    sa = bucket_segments(a, SHAPES, rank=1, min_compression_rate=1.0)
    sb = bucket_segments(b, SHAPES, rank=1, min_compression_rate=1.0)
    state = SimpleNamespace(error_dict={0: torch.arange(48.0)}, p_memory_dict={0: torch.arange(13.0)},
                            q_memory_dict={0: torch.arange(10.0)})
    before = {k: dict(v) for k, v in vars(state).items()}
    permute_state(state, 0, sa, sb)
    for key, (off, n) in sb.error.items():  # each parameter's entries, now at its new offset
        o, _ = sa.error[key]
        assert torch.equal(state.error_dict[0][off:off + n], before["error_dict"][0][o:o + n])
    for key, (off, n) in sb.p.items():
        o, _ = sa.p[key]
        assert torch.equal(state.p_memory_dict[0][off:off + n], before["p_memory_dict"][0][o:o + n])
    assert not torch.equal(state.error_dict[0], before["error_dict"][0])
    permute_state(state, 0, sb, sa)
    for key in before:
        assert torch.equal(getattr(state, key)[0], before[key][0])


def test_a_bucket_with_other_parameters_is_refused():
    sa = bucket_segments([0, 1], SHAPES, rank=1, min_compression_rate=1.0)
    sb = bucket_segments([0, 2], SHAPES, rank=1, min_compression_rate=1.0)
    state = SimpleNamespace(error_dict={0: torch.zeros(16)}, p_memory_dict={}, q_memory_dict={})
    with pytest.raises(RuntimeError, match="other parameters"):
        permute_state(state, 0, sa, sb)
    # a state of another size than the layout says (another torch's hook): refused, not garbled
    state = SimpleNamespace(error_dict={0: torch.zeros(17)}, p_memory_dict={}, q_memory_dict={})
    with pytest.raises(RuntimeError, match="cannot be reordered"):
        permute_state(state, 0, sa, bucket_segments([1, 0], SHAPES, rank=1, min_compression_rate=1.0))
