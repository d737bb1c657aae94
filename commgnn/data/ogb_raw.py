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

(``ogbn-papers100M`` comes as ``raw/data.npz`` (arrays ``edge_index``, ``node_feat``,
``num_nodes_list``, ``num_edges_list``) + ``raw/node-label.npz`` instead: both functions
read that too.)

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
import sys
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


def _import_ogb() -> Any:
    """``import ogb`` without its version check: on import, ogb starts a (non-daemon) thread
    that asks PyPI for a newer release with no timeout, which would reach the network and
    could hold the process open. Hiding the ``outdated`` package for the import makes ogb
    skip it (``ogb/version.py`` catches the ImportError)."""
    try:
        import pandas  # noqa: F401  (ogb's readers need it)
    except ImportError:
        raise DataError("reading OGB's raw layout needs pandas: pip install 'commgnn[datasets]'") from None
    if "ogb" not in sys.modules:
        missing = object()
        saved = sys.modules.get("outdated", missing)
        sys.modules["outdated"] = None  # type: ignore[assignment]
        try:
            import ogb  # noqa: F401
        except ImportError:
            raise DataError("reading OGB's raw layout needs the ogb package: pip install 'commgnn[datasets]'") from None
        finally:
            if saved is missing:
                del sys.modules["outdated"]
            else:
                sys.modules["outdated"] = saved
    return sys.modules["ogb"]


def _ogb_table() -> Any:
    """ogb's table of node-property datasets (``ogb/nodeproppred/master.csv``), by name."""
    import pandas as pd

    ogb = _import_ogb()
    return pd.read_csv(Path(ogb.__file__).parent / "nodeproppred" / "master.csv", index_col=0,
                       keep_default_na=False)


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
    wrong = ((edge_index < 0) | (edge_index >= n)).any(axis=0)
    if wrong.any():
        i = int(np.argmax(wrong))
        row = i // 2 if info.undirected else i  # the stored edge (ogb's inverse edges interleaved)
        where = f"{raw / 'data.npz'} (edge_index): node id out of range [0, {n}) at edge {row}" if info.binary \
            else f"{raw / 'edge.csv.gz'}: node id out of range [0, {n}) at line {row + 1}"
        raise DataError(f"{where} ({int(edge_index[0, i])},{int(edge_index[1, i])})")
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
    return _one_graph(values, path)


def _one_graph(values: np.ndarray, where: Path) -> int:
    if values.size != 1:
        raise DataError(f"{where}: {values.size} graphs; a node-property dataset has one")
    return int(values.reshape(-1)[0])


class _NpzMember:
    """One ``.npy`` member of an ``.npz`` archive, read front to back in blocks (the zip
    stream decompresses as it goes: memory is one block)."""

    def __init__(self, archive: Path, name: str) -> None:
        import zipfile

        self.where = f"{archive} ({name})"
        with _reading(archive):
            self.zf = zipfile.ZipFile(archive)
            if f"{name}.npy" not in self.zf.namelist():
                raise DataError(f"{archive}: no array {name!r} (holds {', '.join(self.zf.namelist())})")
            self.f = self.zf.open(f"{name}.npy")
            version = np.lib.format.read_magic(self.f)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) \
                else np.lib.format.read_array_header_2_0
            self.shape, self.fortran, self.dtype = read_header(self.f)
        if self.dtype.hasobject:
            raise DataError(f"{self.where}: holds Python objects; only plain arrays are read")

    def read(self, count: int) -> np.ndarray:
        with _reading(Path(self.where)):
            buf = self.f.read(count * self.dtype.itemsize)
        if len(buf) != count * self.dtype.itemsize:
            raise DataError(f"{self.where}: truncated")
        return np.frombuffer(buf, dtype=self.dtype)

    def rows(self, chunk_rows: int) -> Iterator[tuple[int, np.ndarray]]:
        """``(first_row, block)`` of a 1-D or C-order 2-D array."""
        if self.fortran and len(self.shape) == 2 and self.shape[1] > 1:
            raise DataError(f"{self.where}: Fortran-ordered; only C order is streamed")
        n, width = self.shape[0], int(np.prod(self.shape[1:], dtype=np.int64))
        for s in range(0, n, chunk_rows):
            t = min(s + chunk_rows, n)
            yield s, self.read((t - s) * width).reshape((t - s, *self.shape[1:]))

    def close(self) -> None:
        self.f.close()
        self.zf.close()


def _edge_rows(info: OgbRaw, n: int, e_raw: int, chunk_rows: int) -> Iterator[tuple[int, int, np.ndarray]]:
    """``(row, first_edge, ids)``: blocks of sources (row 0) and targets (row 1), ids checked."""
    if not info.binary:
        ep = info.path / "raw" / "edge.csv.gz"
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
            yield 0, s, block[:, 0]
            yield 1, s, block[:, 1]
            seen = t
        if seen != e_raw:
            raise DataError(f"{ep}: {seen} lines but num-edge-list.csv.gz says {e_raw}")
        return
    m = _NpzMember(info.path / "raw" / "data.npz", "edge_index")
    try:
        if m.shape != (2, e_raw) or m.dtype.kind not in "iu":
            raise DataError(f"{m.where}: shape {list(m.shape)} dtype {m.dtype}, expected [2, {e_raw}] integers")
        pairs = m.fortran  # Fortran order stores (src, dst) pairs
        for row in ((0,) if pairs else (0, 1)):
            for s in range(0, e_raw, chunk_rows):
                t = min(s + chunk_rows, e_raw)
                ids = m.read((t - s) * (2 if pairs else 1)).astype(np.int64)
                wrong = (ids < 0) | (ids >= n)
                if wrong.any():
                    i = int(np.argmax(wrong))
                    edge = s + (i // 2 if pairs else i)
                    raise DataError(f"{m.where}: node id {int(ids[i])} out of range [0, {n}) at edge {edge}")
                if pairs:
                    yield 0, s, ids[0::2]
                    yield 1, s, ids[1::2]
                else:
                    yield row, s, ids
    finally:
        m.close()


def _node_rows(info: OgbRaw, what: str, chunk_rows: int) -> Iterator[tuple[int, np.ndarray, Path]]:
    """``(first_node, block, file)`` of the features (``what = "feat"``) or labels."""
    raw = info.path / "raw"
    if not info.binary:
        path = raw / f"node-{what}.csv.gz"
        for s, block in _csv_chunks(path, chunk_rows, np.float64):  # as ogb: parsed as float64
            yield s, block, path
        return
    archive, name = (raw / "data.npz", "node_feat") if what == "feat" else (raw / "node-label.npz", "node_label")
    m = _NpzMember(archive, name)
    try:
        for s, block in m.rows(chunk_rows):
            yield s, block, archive
    finally:
        m.close()


def _sizes(info: OgbRaw) -> tuple[int, int, int, str]:
    """``N``, ``E`` as stored, ``F`` and the features' dtype in the graph folder."""
    raw = info.path / "raw"
    if info.binary:
        counts = {}
        for key in ("num_nodes_list", "num_edges_list"):
            m = _NpzMember(raw / "data.npz", key)
            try:
                counts[key] = _one_graph(m.read(int(np.prod(m.shape, dtype=np.int64))), raw / "data.npz")
            finally:
                m.close()
        m = _NpzMember(raw / "data.npz", "node_feat")
        m.close()
        if len(m.shape) != 2:
            raise DataError(f"{m.where}: shape {list(m.shape)}, expected [N, F]")
        return counts["num_nodes_list"], counts["num_edges_list"], int(m.shape[1]), \
            "float16" if m.dtype == np.float16 else "float32"
    first = next(_csv_chunks(raw / "node-feat.csv.gz", 1, np.float64), (0, np.empty((0, 0))))[1]
    if first.shape[0] == 0:
        raise DataError(f"{raw / 'node-feat.csv.gz'}: empty")
    return _count(raw / "num-node-list.csv.gz"), _count(raw / "num-edge-list.csv.gz"), int(first.shape[1]), "float32"


def convert_ogb_raw(src: str | Path, out: str | Path, *, chunk_rows: int = 1 << 17, undirected: bool | None = None,
                    split: str | None = None, x_dtype: str | None = None) -> Path:
    """Convert an OGB raw folder into a graph folder at ``out``, block by block; returns ``out``.

    CSV files are read with ``pandas.read_csv(chunksize=chunk_rows)`` (features parsed as
    float64 then cast, as ogb does); the binary layout (``raw/data.npz``,
    ``raw/node-label.npz``: papers100M) is read member by member from the zip stream
    (:class:`_NpzMember`). Each block goes straight into
    :class:`~commgnn.data.ondisk.GraphFolderWriter`'s memory maps, so memory is
    ``O(chunk_rows * F)`` plus one split's ids at a time (``O(split size)``); no array of
    size ``E`` or ``N x F`` is held. Sizes come from ``num-node-list`` / ``num-edge-list``;
    where the dataset is undirected (module docstring) each edge is written followed by its
    reverse, so ``E`` doubles and ``meta.json`` says ``directed = false``: the edge order
    is exactly :func:`load_ogb_raw`'s. ``x_dtype`` None: float16 for float16 sources,
    else float32. Rows are checked as they stream (counts, node ids in range, finite
    features, labels below the class count), each error one line naming the file and the
    line or edge; the split files' duplicates and overlaps are found when the folder is
    loaded (:func:`~commgnn.data.ondisk_check.check_graph_folder`). A failed conversion
    leaves nothing under ``out``. ``meta.json`` also records ``name`` (ogb's),
    ``source = "ogb"`` and ``split_scheme``."""
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be positive, got {chunk_rows}")
    info = ogb_raw_info(src, undirected=undirected, split=split)
    n, e_raw, f, src_x_dtype = _sizes(info)
    with GraphFolderWriter(out, num_nodes=n, num_edges=(2 if info.undirected else 1) * e_raw, num_features=f,
                           num_classes=info.num_classes or 1, directed=not info.undirected,
                           x_dtype=x_dtype or src_x_dtype,
                           extra_meta={"name": info.name, "source": "ogb", "split_scheme": info.split_dir.name}) as w:
        for row, s, ids in _edge_rows(info, n, e_raw, chunk_rows):
            t = s + ids.shape[0]
            if info.undirected:  # edge i goes to 2i, its reverse to 2i + 1 (ogb's add_inverse_edge)
                w.edge_index[row, 2 * s:2 * t:2] = ids
                w.edge_index[1 - row, 2 * s + 1:2 * t:2] = ids
            else:
                w.edge_index[row, s:t] = ids
        seen, where = 0, info.path / "raw"
        for s, block, where in _node_rows(info, "feat", chunk_rows):
            t = s + block.shape[0]
            if block.ndim != 2 or block.shape[1] != f or t > n:
                raise DataError(f"{where}: rows {s + 1}..{t} do not fit [{n}, {f}] (N from num-node-list)")
            bad = ~np.isfinite(block)
            if bad.any():
                raise DataError(f"{where}: NaN/inf feature at row {s + int(np.argmax(bad.any(axis=1))) + 1}")
            w.x[s:t] = block
            seen = t
        if seen != n:
            raise DataError(f"{where}: {seen} rows but num-node-list says {n} nodes")
        seen, top, where = 0, -1, info.path / "raw"
        for s, block, where in _node_rows(info, "label", chunk_rows):
            y = _labels(block, where)
            t = s + y.shape[0]
            if t > n:
                raise DataError(f"{where}: more than the {n} rows num-node-list says")
            if info.num_classes is not None and (y >= info.num_classes).any():
                i = int(np.argmax(y >= info.num_classes))
                raise DataError(f"{where}: label {int(y[i])} outside [0, {info.num_classes}) at row {s + i + 1}")
            w.y[s:t] = y
            top, seen = max(top, int(y.max(initial=-1))), t
        if seen != n:
            raise DataError(f"{where}: {seen} rows but num-node-list says {n} nodes")
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
