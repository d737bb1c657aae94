"""GNN layers and models that run on one rank's partition plus its halo."""

from commgnn.models.config import ModelConfig
from commgnn.models.graph import CSRPair, LocalGraph, spmm
from commgnn.models.net import PartitionGNN, layer_dims
from commgnn.models.reference import ReferenceGNN

__all__ = ["ModelConfig", "CSRPair", "LocalGraph", "spmm", "PartitionGNN", "ReferenceGNN", "layer_dims"]
