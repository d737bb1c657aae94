"""Gradient synchronisation (``[comm.grad]``): after the backward pass every rank's
gradients are replaced by their (approximate) sum over ranks. Every strategy implements
the :class:`~commgnn.comm.grad_sync.GradSync` Protocol: the exact fp32
:class:`AllReduceSync`, torch's own DDP communication hooks (:class:`DDPHookSync`: fp16,
bf16, PowerSGD, local SGD, with :func:`prescaled` fp16 buckets), and the compressors
written here on :class:`CompressedSync` (top-k, cyclic local top-k, QSGD, signSGD, with
error feedback). :func:`commgnn.comm.build.build_grad_sync` picks one.
"""

from commgnn.comm.grad.allreduce import AllReduceSync
from commgnn.comm.grad.cltk import CyclicTopKSync
from commgnn.comm.grad.compressed import CompressedSync
from commgnn.comm.grad.ddp_hooks import DDPHookSync
from commgnn.comm.grad.prescale import prescaled
from commgnn.comm.grad.qsgd import QSGDSync
from commgnn.comm.grad.signsgd import SignSGDSync
from commgnn.comm.grad.topk import TopKSync

__all__ = ["AllReduceSync", "CompressedSync", "CyclicTopKSync", "DDPHookSync", "QSGDSync", "SignSGDSync", "TopKSync",
           "prescaled"]
