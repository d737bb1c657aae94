"""Halo exchanges: before each layer's aggregation a rank receives the boundary rows it
needs from their owners, and the backward pass returns their gradients. Every strategy
implements the :class:`~commgnn.comm.halo.protocol.HaloExchange` Protocol through
:class:`~commgnn.comm.halo.exchange.RowExchange` (``exchange`` from one ``move``
primitive): :class:`AllToAllHalo` is the exact transport, and each lever (quantization,
adaptive bit-widths, MaxK sparse rows, sampling, pipelining, skipping unchanged rows) is a
:class:`~commgnn.comm.halo.exchange.Wrapper` around another exchange, composed by
:func:`commgnn.comm.build.build_halo`.
"""

from commgnn.comm.halo.adaptive import AdaptiveQuantized
from commgnn.comm.halo.alltoall import AllToAllHalo
from commgnn.comm.halo.exchange import RowExchange, Wrapper
from commgnn.comm.halo.maxk_rows import MaxKRows
from commgnn.comm.halo.sparse_setup import SparseSetup
from commgnn.comm.halo.pipelined import Pipelined
from commgnn.comm.halo.protocol import HaloExchange, HaloPlan
from commgnn.comm.halo.quantized import Quantized
from commgnn.comm.halo.sampled import Sampled
from commgnn.comm.halo.skip import SkipUnchanged

__all__ = ["AdaptiveQuantized", "AllToAllHalo", "HaloExchange", "HaloPlan", "MaxKRows", "Pipelined", "Quantized",
           "RowExchange", "Sampled", "SkipUnchanged", "SparseSetup", "Wrapper"]
