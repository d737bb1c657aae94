"""The data layer: configs, graph loading, the synthetic CSBM, splits and validation.

The first layer of ``commgnn``: it depends only on torch, torch_geometric, numpy, scipy
and the leaf modules ``commgnn.errors`` / ``config`` / ``registry``. Every loader returns
a :class:`torch_geometric.data.Data` in one form (float32 ``x``, int64 ``edge_index`` and
``y``, 1-D bool ``train_mask`` / ``val_mask`` / ``test_mask``, plus ``num_classes_total``,
``name`` and ``graph_notes``) that has passed :func:`validate_graph`.
"""

from commgnn.data.config import DataConfig, SyntheticConfig
from commgnn.data.datasets import GIVEN_GRAPH, dataset_names, load_dataset
from commgnn.data.stratified_split import stratified_split
from commgnn.data.synthetic import make_csbm
from commgnn.data.validate import fingerprint, graph_notes, validate_graph

__all__ = [
    "GIVEN_GRAPH",
    "DataConfig",
    "SyntheticConfig",
    "dataset_names",
    "fingerprint",
    "graph_notes",
    "load_dataset",
    "make_csbm",
    "stratified_split",
    "validate_graph",
]
