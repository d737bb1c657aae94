"""Deprecated (for one release; importing it warns): the old home of the client split.
Import from the modules that hold it:

* :mod:`.client_split` -- the split methods (:func:`split_clients`, :func:`split_from_config`);
* :mod:`.client_map_file` -- reading a node -> client map file (:func:`load_client_map`);
* :mod:`.client_data` -- each client's data and the split's statistics (:class:`ClientData`,
  :func:`build_clients`, :func:`split_stats`);
* :mod:`.config` -- :class:`SplitConfig`.
"""

from __future__ import annotations

import warnings

from commgnn.federated.client_data import ClientData, build_clients, split_stats
from commgnn.federated.client_map_file import load_client_map
from commgnn.federated.client_split import DIRICHLET_TRIES, split_clients, split_from_config
from commgnn.federated.config import FILE_SUFFIXES, SplitConfig, SplitMethod

__all__ = ["DIRICHLET_TRIES", "FILE_SUFFIXES", "ClientData", "SplitConfig", "SplitMethod", "build_clients",
           "load_client_map", "split_clients", "split_from_config", "split_stats"]

warnings.warn("commgnn.federated.splits is deprecated: import from commgnn.federated.client_split, "
              "client_map_file, client_data and config", DeprecationWarning, stacklevel=2)
