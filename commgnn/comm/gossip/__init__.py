"""Decentralised training (``[comm.gossip]``, instead of ``[comm.grad]``): each rank keeps
its own model and averages it with the round's neighbours over point-to-point messages.
Every strategy implements the :class:`~commgnn.comm.grad_sync.GradSync` Protocol (on
:class:`GossipBase`, with ``decentralised = True``): :class:`DPSGD` and
:class:`DPSGDAdaptThenCombine`, :class:`PushSum`, gradient tracking
(:class:`GradientTracking`, :class:`AdaptThenCombineTracking`), and the wrappers
:class:`PeriodicGlobalAverage` (Gossip-PGA) and :class:`QuasiGlobalMomentum` (QG-DSGDm).
:class:`Topology` gives each round's mixing weights; :func:`commgnn.comm.build.build_grad_sync`
composes them.
"""

from commgnn.comm.gossip.base import GossipBase
from commgnn.comm.gossip.dpsgd import DPSGD, DPSGDAdaptThenCombine
from commgnn.comm.gossip.global_average import PeriodicGlobalAverage
from commgnn.comm.gossip.pushsum import PushSum
from commgnn.comm.gossip.quasi_global import QuasiGlobalMomentum
from commgnn.comm.gossip.topology import Topology
from commgnn.comm.gossip.tracking import AdaptThenCombineTracking, GradientTracking

__all__ = ["AdaptThenCombineTracking", "DPSGD", "DPSGDAdaptThenCombine", "GossipBase", "GradientTracking",
           "PeriodicGlobalAverage", "PushSum", "QuasiGlobalMomentum", "Topology"]
