"""Communication strategies: halo exchanges and gradient synchronisation."""

from commgnn.comm.allreduce import AllReduceSync, counted_all_reduce, ring_allreduce_bytes
from commgnn.comm.alltoall import AllToAllHalo
from commgnn.comm.grad_sync import GradSync
from commgnn.comm.halo import HaloExchange, HaloPlan

__all__ = ["AllReduceSync", "counted_all_reduce", "AllToAllHalo", "GradSync", "HaloExchange", "HaloPlan", "ring_allreduce_bytes"]
