"""A graph as a folder of ``.npy`` files that numpy can memory-map: the input format for
graphs that never fit in one process.

Layout of a graph folder::

    meta.json            {"format": "commgnn-graph", "version": 1,
                          "num_nodes": N, "num_edges": E, "num_features": F,
                          "num_classes": C, "directed": bool, (any other JSON keys)}
    edge_index.npy       [2, E] int32 or int64; row 0 = source, row 1 = target (messages
                         flow source -> target, PyG's convention)
    x.npy                [N, F] float32 or float16
    y.npy                [N] integer labels in [0, C)
    split/train.npy      1-D int32/int64 node ids, as OGB's ``get_idx_split`` returns them
    split/valid.npy
    split/test.npy

``directed = false`` says every edge is stored in both directions (as PyG stores an
undirected graph); ``true`` says the edges are used as they are.

Nothing here reads a whole array unless asked: :class:`GraphFolder` opens every file as a
read-only memory map (``np.load(mmap_mode="r")``), so opening a 30 GB folder costs the
headers only. :class:`GraphFolderWriter` fills the arrays chunk by chunk into a hidden
sibling folder and renames it into place on :meth:`~GraphFolderWriter.commit`, so a
stopped writer never leaves a folder that looks complete.

:func:`write_graph_folder` writes an in-memory PyG ``Data`` as a graph folder;
:mod:`commgnn.data.ondisk_check` validates a folder's contents in one streamed pass, hashes
its files, and reads a folder back into memory (``load_graph_folder``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from torch_geometric.data import Data

from commgnn.data.validate import MASK_NAMES
from commgnn.errors import DataError
from commgnn.integrity import replace_dir

FORMAT = "commgnn-graph"
VERSION = 1
SPLITS = ("train", "valid", "test")
"""Split names as OGB's ``get_idx_split`` returns them (``split/<name>.npy``)."""
EDGE_DTYPES = ("int32", "int64")
X_DTYPES = ("float32", "float16")
_META_KEYS = ("num_nodes", "num_edges", "num_features", "num_classes", "directed")


def is_graph_folder(path: str | Path) -> bool:
    """True for a directory holding ``meta.json`` and ``edge_index.npy`` (a graph folder,
    well formed or not: :func:`open_graph_folder` says what is wrong with it)."""
    p = Path(path)
    return p.is_dir() and (p / "meta.json").is_file() and (p / "edge_index.npy").is_file()


def _read_meta(path: Path) -> dict[str, Any]:
    mpath = path / "meta.json"
    try:
        meta = json.loads(mpath.read_text())
    except FileNotFoundError:
        raise DataError(f"{mpath}: missing (a graph folder needs meta.json with {', '.join(_META_KEYS)})") from None
    except (OSError, ValueError) as exc:
        raise DataError(f"{mpath}: not readable JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise DataError(f"{mpath}: expected a JSON object")
    missing = [k for k in _META_KEYS if k not in meta]
    if missing:
        raise DataError(f"{mpath}: missing {', '.join(missing)}")
    for k in ("num_nodes", "num_edges", "num_features", "num_classes"):
        v = meta[k]
        if isinstance(v, bool) or not isinstance(v, int) or v < (1 if k != "num_edges" else 0):
            raise DataError(f"{mpath}: {k} must be a positive integer, got {v!r}")
    if not isinstance(meta["directed"], bool):
        raise DataError(f"{mpath}: directed must be true or false, got {meta['directed']!r}")
    return meta


def _open_npy(path: Path) -> np.ndarray:
    """``path`` as a read-only memory map (headers read, data paged in on use)."""
    if not path.is_file():
        raise DataError(f"{path}: missing")
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: not a readable .npy array ({str(exc).splitlines()[0]})") from None
    if not isinstance(arr, np.ndarray):
        raise DataError(f"{path}: not a .npy array")
    return arr


@dataclass
class GraphFolder:
    """An opened graph folder: sizes from ``meta.json`` (checked against the files' headers)
    and every array as a read-only memory map. Open with :func:`open_graph_folder`."""

    path: Path
    """The folder."""
    meta: dict[str, Any]
    """``meta.json`` as read."""
    _arrays: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    @property
    def num_nodes(self) -> int:
        return int(self.meta["num_nodes"])

    @property
    def num_edges(self) -> int:
        return int(self.meta["num_edges"])

    @property
    def num_features(self) -> int:
        return int(self.meta["num_features"])

    @property
    def num_classes(self) -> int:
        return int(self.meta["num_classes"])

    @property
    def directed(self) -> bool:
        return bool(self.meta["directed"])

    @property
    def edge_index(self) -> np.ndarray:
        """``[2, E]`` memory map (int32 or int64)."""
        return self._arrays["edge_index"]

    @property
    def x(self) -> np.ndarray:
        """``[N, F]`` memory map (float32 or float16)."""
        return self._arrays["x"]

    @property
    def y(self) -> np.ndarray:
        """``[N]`` memory map of integer labels."""
        return self._arrays["y"]

    def split(self, name: str) -> np.ndarray:
        """``split/<name>.npy`` (``train``, ``valid`` or ``test``) as a memory map."""
        return self._arrays[f"split/{name}"]

    def files(self) -> dict[str, Path]:
        """Every data file of the folder by its relative name (``x``, ``split/train``, ...)."""
        return {name: self.path / f"{name}.npy" for name in self._arrays}

    def edge_chunks(self, chunk: int = 1 << 24) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """``(start, src, dst)`` for consecutive blocks of at most ``chunk`` edges, each an
        int64 copy (so a caller may sort or index with it); peak memory ``16 * chunk`` bytes."""
        ei = self.edge_index
        for s in range(0, self.num_edges, chunk):
            e = min(s + chunk, self.num_edges)
            yield s, np.asarray(ei[0, s:e], dtype=np.int64), np.asarray(ei[1, s:e], dtype=np.int64)


def open_graph_folder(path: str | Path) -> GraphFolder:
    """Open a graph folder, checking ``meta.json`` and every file's shape and dtype from
    its header (cheap: no data is read; :mod:`commgnn.data.ondisk_check` streams the
    contents). Raises :class:`~commgnn.errors.DataError` with one line naming the file."""
    p = Path(path).expanduser()
    if not p.is_dir():
        raise DataError(f"{p}: not a folder")
    meta = _read_meta(p)
    N, E, F = meta["num_nodes"], meta["num_edges"], meta["num_features"]
    arrays: dict[str, np.ndarray] = {}
    expect: dict[str, tuple[tuple[int, ...] | None, tuple[str, ...]]] = {
        "edge_index": ((2, E), EDGE_DTYPES),
        "x": ((N, F), X_DTYPES),
        "y": ((N,), ("int8", "int16", "int32", "int64", "uint8", "uint16")),
        **{f"split/{s}": (None, ("int32", "int64")) for s in SPLITS},
    }
    for name, (shape, dtypes) in expect.items():
        arr = _open_npy(p / f"{name}.npy")
        if shape is not None and arr.shape != shape:
            raise DataError(f"{p / (name + '.npy')}: shape {list(arr.shape)}, meta.json says {list(shape)}")
        if shape is None and arr.ndim != 1:
            raise DataError(f"{p / (name + '.npy')}: expected a 1-D array of node ids, got shape {list(arr.shape)}")
        if str(arr.dtype) not in dtypes:
            raise DataError(f"{p / (name + '.npy')}: dtype {arr.dtype}, expected one of {', '.join(dtypes)}")
        arrays[name] = arr
    return GraphFolder(path=p, meta=meta, _arrays=arrays)


class GraphFolderWriter:
    """Write a graph folder chunk by chunk, atomically.

    ``create`` opens every array as a writable memory map inside a hidden sibling folder;
    the caller fills ``edge_index``, ``x``, ``y`` (slices, chunk by chunk) and sets the
    splits with :meth:`set_split`; :meth:`commit` flushes, writes ``meta.json`` last and
    renames the folder into place. :meth:`abort` (or leaving a ``with`` block by an
    exception) removes the hidden folder, so nothing half-written is ever visible under
    ``out``. An existing ``out`` is refused unless it is a graph folder (then replaced)."""

    def __init__(self, out: str | Path, *, num_nodes: int, num_edges: int, num_features: int, num_classes: int,
                 directed: bool, x_dtype: str = "float32", edge_dtype: str | None = None,
                 y_dtype: str = "int64", extra_meta: dict[str, Any] | None = None) -> None:
        if x_dtype not in X_DTYPES:
            raise DataError(f"x dtype must be one of {', '.join(X_DTYPES)}, got {x_dtype}")
        if edge_dtype is None:
            edge_dtype = "int32" if num_nodes <= np.iinfo(np.int32).max else "int64"
        if edge_dtype not in EDGE_DTYPES:
            raise DataError(f"edge dtype must be one of {', '.join(EDGE_DTYPES)}, got {edge_dtype}")
        self.out = Path(out).expanduser()
        if self.out.exists() and not (self.out.is_dir() and (is_graph_folder(self.out) or not any(self.out.iterdir()))):
            raise DataError(f"refusing to overwrite {self.out}: it is not an empty folder or a graph folder")
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.tmp-", dir=self.out.parent))
        (self.tmp / "split").mkdir()
        self.meta: dict[str, Any] = {"format": FORMAT, "version": VERSION, "num_nodes": int(num_nodes),
                                     "num_edges": int(num_edges), "num_features": int(num_features),
                                     "num_classes": int(num_classes), "directed": bool(directed),
                                     **(extra_meta or {})}
        mm = np.lib.format.open_memmap
        self.edge_index = mm(self.tmp / "edge_index.npy", mode="w+", dtype=edge_dtype, shape=(2, num_edges))
        self.x = mm(self.tmp / "x.npy", mode="w+", dtype=x_dtype, shape=(num_nodes, num_features))
        self.y = mm(self.tmp / "y.npy", mode="w+", dtype=y_dtype, shape=(num_nodes,))
        self._splits: set[str] = set()

    def set_split(self, name: str, ids: np.ndarray) -> None:
        """Write ``split/<name>.npy`` (1-D node ids; int32 where the ids fit, else int64)."""
        if name not in SPLITS:
            raise DataError(f"split must be one of {', '.join(SPLITS)}, got {name!r}")
        ids = np.asarray(ids)
        dtype = np.int32 if self.meta["num_nodes"] <= np.iinfo(np.int32).max else np.int64
        np.save(self.tmp / "split" / f"{name}.npy", ids.astype(dtype, copy=False), allow_pickle=False)
        self._splits.add(name)

    def commit(self) -> Path:
        """Flush, write ``meta.json`` and move the folder into place; returns ``out``."""
        for name in SPLITS:
            if name not in self._splits:
                self.set_split(name, np.empty(0, dtype=np.int64))
        for arr in (self.edge_index, self.x, self.y):
            arr.flush()
        del self.edge_index, self.x, self.y
        (self.tmp / "meta.json").write_text(json.dumps(self.meta, indent=1) + "\n")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(self.tmp, 0o777 & ~umask)  # mkdtemp makes it 0700; the folder is an ordinary one
        return replace_dir(self.tmp, self.out)

    def abort(self) -> None:
        """Remove the hidden folder (nothing appears under ``out``)."""
        for name in ("edge_index", "x", "y"):
            self.__dict__.pop(name, None)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> "GraphFolderWriter":
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is not None:
            self.abort()


def write_graph_folder(data: Data, out: str | Path, *, directed: bool | None = None,
                       chunk: int = 1 << 22) -> Path:
    """Write an in-memory graph as a graph folder at ``out``, atomically; returns ``out``.

    ``x`` is stored as float16 if it is float16, else float32; ``edge_index`` as int32
    where the ids fit, as stored (order and duplicates kept); ``y`` as int64 (negative =
    unlabelled); each mask of ``train_mask`` / ``val_mask`` / ``test_mask`` as the sorted
    ids of its True entries (``split/train.npy``, ``valid``, ``test``; empty where the
    graph has no mask). ``num_classes`` is ``data.num_classes_total`` where set, else the
    largest label + 1. ``directed`` None: false exactly when every edge's reverse is
    stored too (:func:`torch_geometric.utils.is_undirected`). Arrays are copied in blocks
    of ``chunk`` rows (no second full copy of the graph). Nothing appears under ``out``
    unless the whole folder was written (:class:`GraphFolderWriter`)."""
    from torch_geometric.utils import is_undirected

    x, edge_index, y = data.x, data.edge_index, data.y
    n = int(data.num_nodes)
    if x is None or edge_index is None or y is None or x.dim() != 2 or edge_index.dim() != 2 \
            or edge_index.size(0) != 2 or y.dim() != 1:
        raise DataError("write_graph_folder needs x [N, F], edge_index [2, E] and y [N]")
    total = data.get("num_classes_total")
    labelled = y[y >= 0]
    c = int(total) if total is not None else (int(labelled.max()) + 1 if labelled.numel() else 1)
    if directed is None:
        directed = not is_undirected(edge_index, num_nodes=n)
    x_dtype = "float16" if x.dtype == torch.float16 else "float32"
    with GraphFolderWriter(out, num_nodes=n, num_edges=int(edge_index.size(1)), num_features=int(x.size(1)),
                           num_classes=max(c, 1), directed=bool(directed), x_dtype=x_dtype) as w:
        for s in range(0, n, chunk):
            w.x[s:s + chunk] = x[s:s + chunk].detach().cpu().numpy()
            w.y[s:s + chunk] = y[s:s + chunk].detach().cpu().numpy()
        for s in range(0, int(edge_index.size(1)), chunk):
            w.edge_index[:, s:s + chunk] = edge_index[:, s:s + chunk].detach().cpu().numpy()
        for split, key in zip(SPLITS, MASK_NAMES):
            mask = data.get(key)
            if mask is not None:
                w.set_split(split, mask.detach().cpu().reshape(-1).nonzero().view(-1).numpy())
        return w.commit()

