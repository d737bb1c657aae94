"""Pre-scaling of gradient buckets before an fp16 DDP comm hook (a hook wrapper).

Why: commgnn's loss is each rank's share of the global mean (``sum / N_train``), so a
rank's gradients are small. On Amazon Computers at initialisation 35% of them lie below
fp16's smallest normal number (6.1e-5), and torch's ``fp16_compress_hook`` divides by P
*before* casting, so even more fall into fp16's subnormals (fewer significant bits) or to
zero (what that costs in accuracy, with and without this wrapper, is on the docs' gradient
sync results page). This wrapper divides the bucket by
the largest magnitude over all ranks (one fp32 all-reduce MAX per bucket, counted), so that
every rank's values lie in [-1, 1], runs the wrapped hook, and multiplies the result back::

    s = max_r max_i |g_r[i]|;   out = s * hook(g / s)

The wrapped hook is torch's own (``fp16_compress_hook``, or ``fp16_compress_wrapper``
around ``powerSGD_hook``); only the scaling is written here.
"""

# No ``from __future__ import annotations``: DDP checks the hook's annotations at runtime
# (``bucket`` must be ``dist.GradBucket``, the result ``torch.futures.Future[torch.Tensor]``).
from typing import Any, Callable

import torch
import torch.distributed as dist

Hook = Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]


def prescaled(hook: Hook, group: Any) -> Hook:
    """``hook`` run on the bucket divided by its largest magnitude over the ranks of ``group``."""

    def prescaled_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        buf = bucket.buffer()
        peak = buf.detach().abs().max().reshape(1).to(torch.float32)  # [1]
        # looked up at call time, so the byte counter of ddp_hooks sees it
        dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=group)
        scale = float(peak) if float(peak) > 0 else 1.0
        buf.div_(scale)
        return hook(state, bucket).then(lambda fut: fut.value().mul_(scale))

    return prescaled_hook
