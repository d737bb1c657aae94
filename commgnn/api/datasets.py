"""``commgnn datasets``: list the named datasets, and make, check and convert graph folders.

::

    commgnn datasets                                  # the names commgnn knows
    commgnn datasets synth --nodes 2449029 --edges 123718280 --out big/products
    commgnn datasets check big/products               # streamed validation + fingerprint
    commgnn datasets convert-ogb ogbn_products --out big/ogbn-products

A graph folder (:mod:`commgnn.data.ondisk`) is what a graph too large for one process is
given as: ``--dataset big/products`` trains on it, and ``commgnn partition`` partitions it
out of core (:mod:`commgnn.partition.folders`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping

from commgnn.data.config import BigSynthConfig
from commgnn.data.ondisk_check import FolderCheck, check_graph_folder
from commgnn.errors import ConfigError
from commgnn.options import OptionSet

SYNTH_OPTIONS = OptionSet("synth", lambda: BigSynthConfig, ())
"""The options of ``commgnn datasets synth`` (:class:`~commgnn.data.config.BigSynthConfig`):
one flag per field (``--nodes``, ``--edges``, ``--community-size``, ...)."""


def synth_graph(out: str | Path, *, config: BigSynthConfig | str | Path | None = None,
                env: Mapping[str, str] | None = None, progress: Callable[[str], None] | None = None,
                **options: Any) -> Path:
    """Generate a big synthetic graph into the graph folder ``out`` (chunk by chunk: the
    graph is never held in memory; :func:`commgnn.data.synth_large.generate_graph_folder`)
    and return its path. Options by keyword are :class:`BigSynthConfig`'s fields
    (``nodes=``, ``edges=``, ``features=``, ...), or ``config=`` a config or TOML file."""
    from commgnn.data.synth_large import generate_graph_folder

    SYNTH_OPTIONS.unknown(list(options), "synth's")
    env = os.environ if env is None else env
    if isinstance(config, BigSynthConfig):
        cfg = SYNTH_OPTIONS.resolve(None, options, env, start=config)
    elif config is None or isinstance(config, (str, Path)):
        cfg = SYNTH_OPTIONS.resolve(str(config) if config else None, options, env)
    else:
        raise ConfigError(f"config= takes a BigSynthConfig or a TOML path, got {type(config).__name__}")
    return generate_graph_folder(cfg, out, progress=progress)


def check_dataset(path: str | Path) -> FolderCheck:
    """Stream every file of the graph folder ``path`` once: a one-line
    :class:`~commgnn.errors.DataError` naming the file and the first bad chunk, else the
    files' sha256 and the folder's fingerprint."""
    return check_graph_folder(path)


def convert_ogb(src: str | Path, out: str | Path, *, undirected: bool | None = None, split: str | None = None,
                x_dtype: str | None = None) -> Path:
    """Convert the raw folder OGB downloads for a node-property dataset into the graph
    folder ``out``, chunk by chunk (:func:`commgnn.data.ogb_raw.convert_ogb_raw`)."""
    from commgnn.data.ogb_raw import convert_ogb_raw

    return convert_ogb_raw(src, out, undirected=undirected, split=split, x_dtype=x_dtype)
