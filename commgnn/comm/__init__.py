"""Communication strategies, one sub-package per concern:

* :mod:`~commgnn.comm.halo` -- halo exchanges (boundary rows forward, their gradients
  backward): the :class:`HaloExchange` Protocol, the all-to-all transport and the levers
  that wrap it;
* :mod:`~commgnn.comm.grad` -- gradient synchronisation: all-reduce, torch's DDP hooks and
  the compressors;
* :mod:`~commgnn.comm.gossip` -- decentralised training, which replaces the gradient sync.

Shared at this level: :mod:`~commgnn.comm.grad_sync` (the :class:`GradSync` Protocol that
``grad`` and ``gossip`` implement), :mod:`~commgnn.comm.collectives` (counted all-reduce),
:mod:`~commgnn.comm.quant` (the packed stochastic codec of halo rows, QSGD and signSGD),
:mod:`~commgnn.comm.config` (``[comm]``) and :mod:`~commgnn.comm.build` (composes a
configuration's strategies).
"""

from commgnn.comm.collectives import counted_all_reduce, ring_allreduce_bytes
from commgnn.comm.grad.allreduce import AllReduceSync
from commgnn.comm.grad_sync import GradSync
from commgnn.comm.halo.alltoall import AllToAllHalo
from commgnn.comm.halo.protocol import HaloExchange, HaloPlan

__all__ = ["AllReduceSync", "counted_all_reduce", "AllToAllHalo", "GradSync", "HaloExchange", "HaloPlan", "ring_allreduce_bytes"]
