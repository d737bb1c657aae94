"""The data layer: configs, graph loading, the synthetic CSBM, splits and validation.

The first layer of ``commgnn``: it depends only on torch, torch_geometric, numpy, scipy
and the leaf modules ``commgnn.errors`` / ``config`` / ``registry`` (pandas and ogb only
inside the functions that read OGB's raw layout). Every loader returns a
:class:`torch_geometric.data.Data` in one form (float32 ``x``, int64 ``edge_index`` and
``y``, 1-D bool ``train_mask`` / ``val_mask`` / ``test_mask``, plus ``num_classes_total``,
``name`` and ``graph_notes``) that has passed :func:`validate_graph`.

Graphs too big for one process live on disk as graph folders (:mod:`commgnn.data.ondisk`:
memory-mappable ``.npy`` files), validated and hashed in one streamed pass
(:func:`check_graph_folder`); OGB's own download layout loads or converts into one
(:mod:`commgnn.data.ogb_raw`).
"""

from commgnn.data.config import DataConfig, SyntheticConfig
from commgnn.data.datasets import GIVEN_GRAPH, dataset_names, is_folder_path, load_dataset
from commgnn.data.ogb_raw import convert_ogb_raw, is_ogb_raw_folder, load_ogb_raw
from commgnn.data.ondisk import GraphFolder, GraphFolderWriter, is_graph_folder, open_graph_folder, write_graph_folder
from commgnn.data.ondisk_check import FolderCheck, check_graph_folder, folder_identity, load_graph_folder
from commgnn.data.stratified_split import stratified_split
from commgnn.data.synthetic import make_csbm
from commgnn.data.validate import fingerprint, graph_notes, validate_graph

__all__ = [
    "GIVEN_GRAPH",
    "DataConfig",
    "FolderCheck",
    "GraphFolder",
    "GraphFolderWriter",
    "SyntheticConfig",
    "check_graph_folder",
    "convert_ogb_raw",
    "dataset_names",
    "fingerprint",
    "folder_identity",
    "graph_notes",
    "is_folder_path",
    "is_graph_folder",
    "is_ogb_raw_folder",
    "load_dataset",
    "load_graph_folder",
    "load_ogb_raw",
    "make_csbm",
    "open_graph_folder",
    "stratified_split",
    "validate_graph",
    "write_graph_folder",
]
