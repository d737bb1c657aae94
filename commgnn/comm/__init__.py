"""Communication strategies: halo exchanges and gradient synchronisation."""

from commgnn.comm.allreduce import AllReduceSync, ring_allreduce_bytes
from commgnn.comm.alltoall import AllToAllHalo
from commgnn.comm.grad_sync import GradSync
from commgnn.comm.halo import HaloExchange, HaloPlan

__all__ = ["AllReduceSync", "AllToAllHalo", "GradSync", "HaloExchange", "HaloPlan", "ring_allreduce_bytes"]
