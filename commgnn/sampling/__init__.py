"""Mini-batch samplers, one per module behind the :class:`~commgnn.sampling.base.Sampler`
Protocol: neighbour (GraphSAGE), Cluster-GCN, GraphSAINT (node, edge, random walk) and
VR-GCN. Each runs in a single process on a :class:`~commgnn.sampling.csr.CSRTopology`;
:mod:`commgnn.sampling.remote` adds owner-side sampling over a partitioned topology."""

from commgnn.sampling.base import Block, MiniBatch, Sampler
from commgnn.sampling.config import SAMPLERS, ClusterGCNConfig, SaintConfig, SamplerConfig
from commgnn.sampling.csr import CSRTopology

__all__ = ["SAMPLERS", "Block", "CSRTopology", "ClusterGCNConfig", "MiniBatch", "SaintConfig", "Sampler",
           "SamplerConfig"]
