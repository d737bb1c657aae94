"""OGB's own layout for node-property datasets: loaded through the ``ogb`` library where the
graph fits in memory, converted chunk by chunk into a graph folder where it does not.

The folder the ``ogb`` package downloads for a homogeneous node-property dataset (e.g.
``dataset/ogbn_products/``)::

    raw/num-node-list.csv.gz   one line: N (a node-property dataset is one graph)
    raw/num-edge-list.csv.gz   one line: E as stored
    raw/edge.csv.gz            E lines "src,dst"
    raw/node-feat.csv.gz       N lines of F numbers
    raw/node-label.csv.gz      N lines of one label (empty/NaN = unlabelled)
    split/<scheme>/{train,valid,test}.csv.gz   one node id a line

(``ogbn-papers100M`` comes as ``raw/data.npz`` + ``raw/node-label.npz`` instead: loaded in
memory by :func:`load_ogb_raw`; :func:`convert_ogb_raw` reads the CSV layout only.)

Direction follows ogb's own table (``ogb/nodeproppred/master.csv``, looked up by the
folder's name, ``ogbn_products`` -> ``ogbn-products``): where it says
``add_inverse_edge`` (ogbn-products, ogbn-proteins), ogb's reader, and so PyG's
``PygNodePropPredDataset``, stores each edge followed by its reverse, so that the graph is
undirected with ``2 E`` edges. Both functions here do exactly that, in that order (not
``to_undirected``, which would also sort and deduplicate), so they give the graph PyG
gives. Other datasets (ogbn-arxiv, ogbn-papers100M) keep their edges as stored
(directed). A folder of another name needs ``undirected=`` given. The split is
``split/<scheme>`` of the table's scheme, or the folder's only scheme, or ``split=``.
Unlabelled nodes (a NaN label) get ``y = -1``; the class count is the table's.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from torch_geometric.data import Data

from commgnn.data.ondisk import SPLITS, GraphFolderWriter
from commgnn.data.validate import MASK_NAMES, graph_notes
from commgnn.errors import DataError

_CSV = ("num-node-list.csv.gz", "num-edge-list.csv.gz", "edge.csv.gz", "node-feat.csv.gz", "node-label.csv.gz")


def is_ogb_raw_folder(path: str | Path) -> bool:
    """True for a folder with a ``raw/`` subfolder holding ogb's graph files (CSV or binary)."""
    raw = Path(path).expanduser() / "raw"
    return raw.is_dir() and any((raw / f).is_file() for f in ("num-node-list.csv.gz", "edge.csv.gz", "data.npz"))


@dataclass(frozen=True, kw_only=True)
class OgbRaw:
    """What :func:`ogb_raw_info` found out about an OGB raw folder."""

    path: Path
    """The dataset folder (holding ``raw/`` and ``split/``)."""
    name: str
    """ogb's name (``ogbn-products``), from the folder's name."""
    undirected: bool
    """Every stored edge is followed by its reverse when loaded (ogb's ``add_inverse_edge``)."""
    num_classes: int | None
    """From ogb's table; None for a folder ogb does not know (then the largest label + 1)."""
    split_dir: Path
    """``split/<scheme>``."""
    binary: bool
    """``raw/data.npz`` (papers100M) rather than CSV files."""


def _ogb_table() -> Any:
    try:
        import pandas as pd
        import ogb.nodeproppred
    except ImportError as exc:
        raise DataError(f"reading OGB's raw layout needs the ogb package ({exc.name} is missing): "
                        f"pip install 'commgnn[datasets]'") from None
    return pd.read_csv(Path(ogb.nodeproppred.__file__).parent / "master.csv", index_col=0, keep_default_na=False)


def ogb_raw_info(path: str | Path, *, undirected: bool | None = None, split: str | None = None) -> OgbRaw:
    """Name, direction, class count and split folder of the OGB raw folder ``path``."""
    p = Path(path).expanduser()
    if not p.is_dir():
        raise DataError(f"{p}: not a folder")
    if not is_ogb_raw_folder(p):
        raise DataError(f"{p / 'raw'}: missing or without ogb's files (num-node-list.csv.gz, edge.csv.gz, ...)")
    table = _ogb_table()
    dir_name = p.resolve().name.removesuffix("_pyg")
    name = "-".join(dir_name.split("_"))
    info = table[name] if name in table else None
    if info is not None and info["is hetero"] == "True":
        raise DataError(f"{p}: {name} is a heterogeneous graph; only homogeneous node-property datasets load")
    if undirected is None:
        if info is None:
            raise DataError(f"{p}: not one of ogb's node-property datasets by its name ({', '.join(table.columns)}), "
                            f"so whether its edges are undirected is unknown (pass undirected=True or False)")
        undirected = info["add_inverse_edge"] == "True"
    schemes = sorted(d.name for d in (p / "split").iterdir() if d.is_dir()) if (p / "split").is_dir() else []
    if split is None:
        split = info["split"] if info is not None and info["split"] in schemes else (schemes[0] if len(schemes) == 1 else None)
    if split is None or split not in schemes:
        raise DataError(f"{p / 'split'}: " + (f"no split scheme {split!r}" if split else "no single split scheme")
                        + f" (found: {', '.join(schemes) or 'none'})")
    binary = (p / "raw" / "data.npz").is_file()
    need = [p / "raw" / f for f in (("data.npz", "node-label.npz") if binary else _CSV)]
    need += [p / "split" / split / f"{s}.csv.gz" for s in SPLITS]
    for f in need:
        if not f.is_file():
            raise DataError(f"{f}: missing")
    return OgbRaw(path=p, name=name, undirected=bool(undirected), split_dir=p / "split" / split, binary=binary,
                  num_classes=int(info["num classes"]) if info is not None else None)


@contextlib.contextmanager
def _reading(what: Path) -> Iterator[None]:
    """ogb's and pandas' progress output silenced, their failures one line naming ``what``."""
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    except DataError:
        raise
    except Exception as exc:  # a malformed CSV, a zip error, ...: one line for the user
        text = " ".join(str(exc).split())[:300]
        raise DataError(f"{what}: cannot read it ({type(exc).__name__}: {text})") from exc


def _labels(values: np.ndarray, where: Path) -> np.ndarray:
    """One label a node as int64, NaN -> -1 (unlabelled)."""
    if values.ndim == 2 and values.shape[1] != 1:
        raise DataError(f"{where}: {values.shape[1]} labels a node; only one class a node is supported")
    values = values.reshape(-1)
    if values.dtype.kind == "f":
        out = np.full(values.shape, -1, dtype=np.int64)
        ok = ~np.isnan(values)
        out[ok] = values[ok].astype(np.int64)
        return out
    return values.astype(np.int64)


def _interleave(edges: np.ndarray) -> np.ndarray:
    """``[2, E]`` -> ``[2, 2E]``: each edge followed by its reverse (ogb's ``add_inverse_edge``)."""
    out = np.empty((2, 2 * edges.shape[1]), dtype=edges.dtype)
    out[:, 0::2] = edges
    out[:, 1::2] = edges[::-1]
    return out


def load_ogb_raw(path: str | Path, *, undirected: bool | None = None, split: str | None = None) -> Data:
    """An OGB raw folder read in memory through ogb's own reader
    (``ogb.io.read_graph_raw.read_csv_graph_raw``, or ``read_binary_graph_raw`` for
    ``raw/data.npz``), as the other loaders return graphs (:mod:`commgnn.data`): ``x``
    float32, ``edge_index`` int64 with ogb's inverse edges added where the dataset is
    undirected (the module docstring says when), ``y`` int64 (``-1`` = unlabelled), bool
    masks from ``split/<scheme>``, ``num_classes_total``, ``name`` (ogb's) and
    ``graph_notes``. Memory: what ogb's reader holds (the whole graph, in float64 and
    int64 while parsing)."""
    import pandas as pd

    info = ogb_raw_info(path, undirected=undirected, split=split)
    raw = info.path / "raw"
    with _reading(raw):
        if info.binary:
            from ogb.io.read_graph_raw import read_binary_graph_raw

            graph = read_binary_graph_raw(str(raw), add_inverse_edge=False)[0]
            edge_index = graph["edge_index"].astype(np.int64)
            if info.undirected:  # ogb's binary reader refuses add_inverse_edge: the same by hand
                edge_index = _interleave(edge_index)
            with np.load(raw / "node-label.npz", allow_pickle=False) as z:
                labels = z["node_label"]
        else:
            from ogb.io.read_graph_raw import read_csv_graph_raw

            graph = read_csv_graph_raw(str(raw), add_inverse_edge=info.undirected)[0]
            edge_index = graph["edge_index"].astype(np.int64)
            labels = pd.read_csv(raw / "node-label.csv.gz", compression="gzip", header=None).values
    n = int(graph["num_nodes"])
    feat = graph["node_feat"]
    if feat is None:
        raise DataError(f"{raw}: no node features (node-feat.csv.gz); a graph needs x")
    y = _labels(labels, raw / ("node-label.npz" if info.binary else "node-label.csv.gz"))
    for what, arr in (("node-feat", feat), ("node-label", y)):
        if arr.shape[0] != n:
            raise DataError(f"{raw}: {what} has {arr.shape[0]} rows but num-node-list says {n} nodes")
    masks = {}
    for s, key in zip(SPLITS, MASK_NAMES):
        f = info.split_dir / f"{s}.csv.gz"
        with _reading(f):
            ids = pd.read_csv(f, compression="gzip", header=None).values.reshape(-1).astype(np.int64)
        _in_range(ids, n, f, 0)
        mask = torch.zeros(n, dtype=torch.bool)
        mask[torch.from_numpy(ids)] = True
        masks[key] = mask
    labelled = y[y >= 0]
    c = info.num_classes if info.num_classes is not None else (int(labelled.max()) + 1 if labelled.size else 1)
    data = Data(x=torch.from_numpy(np.ascontiguousarray(feat, dtype=np.float32)),
                edge_index=torch.from_numpy(edge_index), y=torch.from_numpy(y), **masks,
                num_nodes=n, num_classes_total=c, name=info.name)
    data.graph_notes = graph_notes(data)
    return data


def _in_range(ids: np.ndarray, n: int, where: Path, first_row: int) -> None:
    wrong = (ids < 0) | (ids >= n)
    if wrong.any():
        i = int(np.argmax(wrong))
        raise DataError(f"{where}: node id {int(ids[i])} out of range [0, {n}) at line {first_row + i + 1}")


def _csv_chunks(path: Path, rows: int, dtype: Any) -> Iterator[tuple[int, np.ndarray]]:
    """``(first_row, block)`` of a headerless gzip CSV, ``rows`` lines at a time."""
    import pandas as pd

    start = 0
    with _reading(path):  # nothing is printed here: the context only turns failures into one line
        reader = pd.read_csv(path, compression="gzip", header=None, chunksize=rows, dtype=dtype)
    try:
        while True:
            with _reading(path):
                frame = next(reader, None)
            if frame is None:
                return
            block = frame.to_numpy()
            yield start, block
            start += block.shape[0]
    finally:
        reader.close()


def _count(path: Path) -> int:
    """The sum of a one-column list file (``num-node-list``, ``num-edge-list``): one graph."""
    import pandas as pd

    with _reading(path):
        values = pd.read_csv(path, compression="gzip", header=None).values.reshape(-1)
    if values.size != 1:
        raise DataError(f"{path}: {values.size} graphs; a node-property dataset has one")
    return int(values[0])


def convert_ogb_raw(src: str | Path, out: str | Path, *, chunk_rows: int = 1 << 17, undirected: bool | None = None,
                    split: str | None = None, x_dtype: str = "float32") -> Path:
    """Convert an OGB raw folder (CSV layout) into a graph folder at ``out``; returns ``out``.

    Reads each CSV with ``pandas.read_csv(chunksize=chunk_rows)`` and writes the block into
    :class:`~commgnn.data.ondisk.GraphFolderWriter`'s memory maps, so memory is
    ``O(chunk_rows * F)`` (pandas parses features as float64 then casts, as ogb does) plus
    one split's ids at a time (``O(split size)``). Sizes come from ``num-node-list`` and
    ``num-edge-list``; where the dataset is undirected (module docstring) each edge is
    written followed by its reverse, so ``E`` doubles and ``meta.json`` says
    ``directed = false``; the edge order is then exactly :func:`load_ogb_raw`'s. Rows are
    checked as they stream (counts, node ids in range, finite features, labels below the
    class count), each error one line naming the CSV file and line; a failed conversion
    leaves nothing under ``out``. ``meta.json`` also records ``name`` (ogb's),
    ``source = "ogb"`` and ``split_scheme``."""
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be positive, got {chunk_rows}")
    info = ogb_raw_info(src, undirected=undirected, split=split)
    if info.binary:
        raise DataError(f"{info.path / 'raw' / 'data.npz'}: the binary layout is not converted (only CSV); "
                        f"load it in memory with load_ogb_raw")
    raw = info.path / "raw"
    n, e_raw = _count(raw / "num-node-list.csv.gz"), _count(raw / "num-edge-list.csv.gz")
    feat_path = raw / "node-feat.csv.gz"
    first = next(_csv_chunks(feat_path, 1, np.float64), (0, np.empty((0, 0))))[1]
    if first.shape[0] == 0:
        raise DataError(f"{feat_path}: empty")
    f = int(first.shape[1])
    mult = 2 if info.undirected else 1
    with GraphFolderWriter(out, num_nodes=n, num_edges=mult * e_raw, num_features=f,
                           num_classes=info.num_classes or 1, directed=not info.undirected, x_dtype=x_dtype,
                           extra_meta={"name": info.name, "source": "ogb", "split_scheme": info.split_dir.name}) as w:
        ep = raw / "edge.csv.gz"
        seen = 0
        for s, block in _csv_chunks(ep, chunk_rows, np.int64):
            t = s + block.shape[0]
            if block.ndim != 2 or block.shape[1] != 2:
                raise DataError(f"{ep}: expected 2 columns (src,dst), got {block.shape[1]} at lines {s + 1}..{t}")
            if t > e_raw:
                raise DataError(f"{ep}: more than the {e_raw} lines num-edge-list.csv.gz says")
            wrong = ((block < 0) | (block >= n)).any(axis=1)
            if wrong.any():
                i = int(np.argmax(wrong))
                raise DataError(f"{ep}: node id out of range [0, {n}) at line {s + i + 1} "
                                f"({int(block[i, 0])},{int(block[i, 1])})")
            if info.undirected:
                w.edge_index[:, 2 * s:2 * t:2] = block.T
                w.edge_index[:, 2 * s + 1:2 * t:2] = block.T[::-1]
            else:
                w.edge_index[:, s:t] = block.T
            seen = t
        if seen != e_raw:
            raise DataError(f"{ep}: {seen} lines but num-edge-list.csv.gz says {e_raw}")
        seen = 0
        for s, block in _csv_chunks(feat_path, chunk_rows, np.float64):
            t = s + block.shape[0]
            if block.shape[1] != f or t > n:
                raise DataError(f"{feat_path}: lines {s + 1}..{t} do not fit [{n}, {f}] (N from num-node-list.csv.gz)")
            bad = ~np.isfinite(block)
            if bad.any():
                i = int(np.argmax(bad.any(axis=1)))
                raise DataError(f"{feat_path}: NaN/inf feature at line {s + i + 1}")
            w.x[s:t] = block.astype(np.float32)
            seen = t
        if seen != n:
            raise DataError(f"{feat_path}: {seen} lines but num-node-list.csv.gz says {n} nodes")
        lp, seen, top = raw / "node-label.csv.gz", 0, -1
        for s, block in _csv_chunks(lp, chunk_rows, np.float64):
            y = _labels(block, lp)
            t = s + y.shape[0]
            if t > n:
                raise DataError(f"{lp}: more than the {n} lines num-node-list.csv.gz says")
            if info.num_classes is not None and (y >= info.num_classes).any():
                i = int(np.argmax(y >= info.num_classes))
                raise DataError(f"{lp}: label {int(y[i])} outside [0, {info.num_classes}) at line {s + i + 1}")
            w.y[s:t] = y
            top, seen = max(top, int(y.max(initial=-1))), t
        if seen != n:
            raise DataError(f"{lp}: {seen} lines but num-node-list.csv.gz says {n} nodes")
        if info.num_classes is None:
            w.meta["num_classes"] = max(top + 1, 1)
        for name in SPLITS:
            sp = info.split_dir / f"{name}.csv.gz"
            parts = []
            for s, block in _csv_chunks(sp, chunk_rows, np.int64):
                ids = block.reshape(-1)
                _in_range(ids, n, sp, s)
                parts.append(ids)
            w.set_split(name, np.concatenate(parts) if parts else np.empty(0, dtype=np.int64))
        return w.commit()
