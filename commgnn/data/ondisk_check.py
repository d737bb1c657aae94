"""Streamed validation of a graph folder (:mod:`commgnn.data.ondisk`), with content hashes.

:func:`check_graph_folder` reads every file of the folder once, front to back, in blocks
of at most ``chunk`` array items, and in that same pass

* checks the contents: edge ids in ``[0, N)``; finite features; labels below ``C``
  (a negative label means unlabelled, as everywhere in commgnn); split ids in ``[0, N)``,
  no id twice in a split, no id in two splits, no unlabelled node in a split;
* hashes every file's raw bytes (header included: the hash is the file's ``sha256sum``),
  and ``meta.json``.

The first problem is a one-line :class:`~commgnn.errors.DataError` naming the file and
the first bad chunk, e.g. ``/g/edge_index.npy: node id 1000 out of range [0, 1000) in
edges 4194304..8388607 (chunk 1; first at edge 4194400, target)``. Missing files and
wrong shapes or dtypes are found first, from the headers (:func:`open_graph_folder`).

Memory: one block buffer (``chunk`` items of the file's dtype, reused), the block's
temporaries (a few times that), and one byte per node (``N`` bytes) that records which
split each node is in and whether it is labelled. Nothing of size ``E`` is held.

Written by hand: numpy reads ``.npy`` headers (``np.lib.format``) but has no streamed
reader that also yields the file's bytes for hashing; hashing a memory map instead would
hash the parsed array, not the file.

:func:`load_graph_folder` reads a checked folder into memory, as the other loaders return
graphs. :func:`folder_identity` is the cheap counterpart (sizes and modification times, no
reading) that a run records to recognise the same folder later without rehashing.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import numpy as np

import torch
from torch_geometric.data import Data

from commgnn.data.ondisk import SPLITS, open_graph_folder
from commgnn.data.validate import MASK_NAMES, graph_notes
from commgnn.errors import DataError

DATA_FILES = ("edge_index.npy", "x.npy", "y.npy", *(f"split/{s}.npy" for s in SPLITS))
"""The data files of a graph folder by relative name, in the order they are checked."""

_UNLABELLED = np.uint8(8)
"""Flag in the per-node byte: y < 0 (bits 0-2 say which split holds the node)."""


@dataclass(frozen=True, kw_only=True)
class FolderCheck:
    """What :func:`check_graph_folder` found in a valid graph folder."""

    path: Path
    """The folder, resolved."""
    meta: dict[str, Any]
    """``meta.json`` as read."""
    file_hashes: dict[str, str]
    """sha256 hex digest of each file's bytes, by relative name (``meta.json``,
    ``edge_index.npy``, ``split/train.npy``, ...)."""
    fingerprint: str
    """sha256 hex digest of the canonical JSON (sorted keys, no spaces) of
    ``{"meta": meta, "files": {name: hash}}`` over the ``.npy`` files: reformatting
    ``meta.json`` leaves it, any change to a value or to a file's bytes changes it."""


def folder_fingerprint(meta: dict[str, Any], file_hashes: dict[str, str]) -> str:
    """:attr:`FolderCheck.fingerprint` of ``meta`` and the hashes (``meta.json``'s own is ignored)."""
    files = {k: file_hashes[k] for k in sorted(file_hashes) if k != "meta.json"}
    text = json.dumps({"meta": meta, "files": files}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


class _RawReader:
    """Reads a ``.npy`` file front to back in blocks of items, hashing every byte read."""

    def __init__(self, path: Path, f: BinaryIO, max_items: int) -> None:
        self.path, self.f = path, f
        self.hash = hashlib.sha256()
        version = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        self.shape, self.fortran, self.dtype = read_header(f)
        end = f.tell()
        f.seek(0)
        self.hash.update(f.read(end))
        self.buf = bytearray(max(1, max_items) * self.dtype.itemsize)

    def read(self, n: int) -> np.ndarray:
        """The next ``n`` items (a view of the reused buffer: valid until the next call)."""
        want = n * self.dtype.itemsize
        if want > len(self.buf):  # one row of x wider than a chunk
            self.buf = bytearray(want)
        view = memoryview(self.buf)[:want]
        got = self.f.readinto(view)
        if got != want:
            raise DataError(f"{self.path}: truncated (the data ends {want - (got or 0)} bytes early)")
        self.hash.update(view)
        return np.frombuffer(self.buf, dtype=self.dtype, count=n)

    def finish(self) -> str:
        """Hash whatever follows the data (nothing, for a file ``np.save`` wrote)."""
        while block := self.f.read(1 << 20):
            self.hash.update(block)
        return self.hash.hexdigest()


def _spans(total: int, step: int) -> Iterator[tuple[int, int, int]]:
    """``(k, start, stop)`` of the consecutive blocks of ``step`` in ``range(total)``."""
    for k, s in enumerate(range(0, total, step)):
        yield k, s, min(s + step, total)


def _check_edges(r: _RawReader, n: int, e: int, chunk: int) -> None:
    """Every id in ``[0, n)``. C order stores all sources, then all targets; Fortran order
    stores (source, target) pairs."""
    def bad(ids: np.ndarray, s: int, t: int, k: int, row: int | None) -> None:
        wrong = (ids < 0) | (ids >= n)
        if wrong.any():
            i = int(np.argmax(wrong))
            edge, side = (s + i // 2, i % 2) if row is None else (s + i, row)
            raise DataError(f"{r.path}: node id {int(ids[i])} out of range [0, {n}) in edges {s}..{t - 1} "
                            f"(chunk {k}; first at edge {edge}, {('source', 'target')[side]})")

    if r.fortran:
        for k, s, t in _spans(e, chunk):
            bad(r.read(2 * (t - s)), s, t, k, None)
        return
    for row in (0, 1):
        for k, s, t in _spans(e, chunk):
            bad(r.read(t - s), s, t, k, row)


def _check_x(r: _RawReader, n: int, f: int, chunk: int) -> None:
    """Every feature finite. C order: blocks of whole rows; Fortran order: one column at a time."""
    def bad(vals: np.ndarray, s: int, t: int, k: int, where: str) -> None:
        ok = np.isfinite(vals)
        if not ok.all():
            i = np.unravel_index(int(np.argmin(ok)), vals.shape)
            v = vals[i]
            node, feat = (s + int(i[0]), int(i[1])) if vals.ndim == 2 else (s + int(i[0]), int(where))
            raise DataError(f"{r.path}: {'NaN' if np.isnan(v) else 'inf'} feature in nodes {s}..{t - 1} "
                            f"(chunk {k}; first at node {node}, feature {feat})")

    if r.fortran:
        for col in range(f):
            for k, s, t in _spans(n, chunk):
                bad(r.read(t - s), s, t, k, str(col))
        return
    rows = max(1, chunk // max(f, 1))
    for k, s, t in _spans(n, rows):
        bad(r.read((t - s) * f).reshape(t - s, f), s, t, k, "")


def _check_y(r: _RawReader, n: int, c: int, chunk: int, flags: np.ndarray) -> None:
    """Every label below ``c``; negative labels (unlabelled) are flagged in ``flags``."""
    for k, s, t in _spans(n, chunk):
        y = r.read(t - s)
        over = y >= c
        if over.any():
            i = int(np.argmax(over))
            raise DataError(f"{r.path}: label {int(y[i])} outside [0, {c}) in nodes {s}..{t - 1} "
                            f"(chunk {k}; first at node {s + i}; meta.json says num_classes = {c})")
        if y.dtype.kind == "i":
            flags[s:t][y < 0] |= _UNLABELLED


def _check_split(r: _RawReader, name: str, bit: int, n: int, chunk: int, flags: np.ndarray,
                 allow_overlap: bool) -> None:
    """Ids in range, none twice, none in an earlier split (unless allowed), none unlabelled."""
    (length,) = r.shape
    for k, s, t in _spans(length, chunk):
        ids = r.read(t - s).astype(np.int64)
        where = f"in ids {s}..{t - 1} (chunk {k}"
        wrong = (ids < 0) | (ids >= n)
        if wrong.any():
            i = int(np.argmax(wrong))
            raise DataError(f"{r.path}: node id {int(ids[i])} out of range [0, {n}) {where}; first at "
                            f"position {s + i})")
        srt = np.sort(ids)
        dup = srt[1:] == srt[:-1]
        if dup.any():
            raise DataError(f"{r.path}: node id {int(srt[1:][dup][0])} appears twice {where})")
        seen = flags[ids]
        again = (seen & np.uint8(1 << bit)) != 0
        if again.any():
            i = int(np.argmax(again))
            raise DataError(f"{r.path}: node id {int(ids[i])} appears twice: again {where}; "
                            f"position {s + i})")
        other = (seen & np.uint8(7 & ~(1 << bit))) != 0
        if other.any() and not allow_overlap:
            i = int(np.argmax(other))
            first = next(SPLITS[b] for b in range(3) if int(seen[i]) & (1 << b))
            raise DataError(f"{r.path}: node id {int(ids[i])} is also in split/{first}.npy {where}; "
                            f"position {s + i}): the splits must not overlap (or set data.allow_mask_overlap = true)")
        unl = (seen & _UNLABELLED) != 0
        if unl.any():
            i = int(np.argmax(unl))
            raise DataError(f"{r.path}: node {int(ids[i])} has no label (y < 0 in y.npy) {where}; "
                            f"position {s + i})")
        flags[ids] |= np.uint8(1 << bit)


def check_graph_folder(path: str | Path, *, chunk: int = 1 << 22, allow_overlap: bool = False) -> FolderCheck:
    """Validate a graph folder in one streamed pass over each file and hash its bytes.

    Args:
        path: the graph folder.
        chunk: items per block (edges per block of ``edge_index.npy``, nodes per block of
            ``y.npy`` and the splits, about ``chunk / F`` rows per block of ``x.npy``);
            messages number the blocks from 0.
        allow_overlap: accept a node in two splits (``data.allow_mask_overlap``;
            :func:`~commgnn.data.validate_graph` then warns about it).

    Returns:
        :class:`FolderCheck` with every file's sha256 and the folder's fingerprint.

    Raises:
        DataError: one line naming the file and, for bad contents, the first bad chunk.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be positive, got {chunk}")
    gf = open_graph_folder(path)
    n, e, f, c = gf.num_nodes, gf.num_edges, gf.num_features, gf.num_classes
    hashes = {"meta.json": hashlib.sha256((gf.path / "meta.json").read_bytes()).hexdigest()}
    flags = np.zeros(n, dtype=np.uint8)
    for name in DATA_FILES:
        fpath = gf.path / name
        try:
            with fpath.open("rb") as fh:
                r = _RawReader(fpath, fh, chunk if name != "edge_index.npy" else 2 * chunk)
                if name == "edge_index.npy":
                    _check_edges(r, n, e, chunk)
                elif name == "x.npy":
                    _check_x(r, n, f, chunk)
                elif name == "y.npy":
                    _check_y(r, n, c, chunk, flags)
                else:
                    split = name[len("split/"):-len(".npy")]
                    _check_split(r, name, SPLITS.index(split), n, chunk, flags, allow_overlap)
                hashes[name] = r.finish()
        except OSError as exc:
            raise DataError(f"{fpath}: cannot read ({exc.strerror or exc})") from None
        except ValueError as exc:  # a header np.lib.format cannot parse (open_graph_folder read it, so rare)
            raise DataError(f"{fpath}: not a readable .npy file ({str(exc).splitlines()[0]})") from None
    return FolderCheck(path=gf.path.resolve(), meta=gf.meta, file_hashes=hashes,
                       fingerprint=folder_fingerprint(gf.meta, hashes))


def folder_identity(path: str | Path) -> dict[str, Any]:
    """What recognises the same folder later without reading it: the resolved path and, for
    ``meta.json`` and each data file, its size and ``mtime_ns`` (``{"missing": True}`` for
    a file that is not there). A file rewritten in place changes its entry."""
    p = Path(path).expanduser().resolve()
    files: dict[str, Any] = {}
    for name in ("meta.json", *DATA_FILES):
        try:
            st = (p / name).stat()
            files[name] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
        except OSError:
            files[name] = {"missing": True}
    return {"path": str(p), "files": files}


def load_graph_folder(path: str | Path, *, check: bool = True, allow_overlap: bool = False) -> Data:
    """A graph folder read into memory, in the form of :mod:`commgnn.data`'s loaders.

    With ``check`` (default) the folder first passes
    :func:`~commgnn.data.ondisk_check.check_graph_folder` (``allow_overlap`` passed on), so
    a bad folder is a one-line :class:`DataError` naming the file and chunk. The result has
    ``x`` ``[N, F]`` float32, ``edge_index`` ``[2, E]`` int64 exactly as stored (a folder
    with ``directed = false`` already holds both directions; self loops are kept here,
    :func:`~commgnn.data.load_dataset` drops them), ``y`` ``[N]`` int64, 1-D bool
    ``train_mask`` / ``val_mask`` / ``test_mask`` from the split files,
    ``num_classes_total`` = ``meta.json``'s ``num_classes``, ``name`` = ``meta.json``'s
    ``name`` or else the folder's name, and ``graph_notes`` (:func:`graph_notes`).
    Memory: the graph itself (x as float32, edges as int64) plus one file's copy at a time."""
    if check:
        check_graph_folder(path, allow_overlap=allow_overlap)
    gf = open_graph_folder(path)
    n = gf.num_nodes
    x = torch.from_numpy(np.array(gf.x, dtype=np.float32))
    edge_index = torch.from_numpy(np.array(gf.edge_index, dtype=np.int64))
    y = torch.from_numpy(np.array(gf.y, dtype=np.int64))
    masks = {}
    for split, key in zip(SPLITS, MASK_NAMES):
        mask = torch.zeros(n, dtype=torch.bool)
        mask[torch.from_numpy(np.array(gf.split(split), dtype=np.int64))] = True
        masks[key] = mask
    name = gf.meta.get("name")
    data = Data(x=x, edge_index=edge_index, y=y, **masks, num_nodes=n, num_classes_total=gf.num_classes,
                name=name if isinstance(name, str) and name else gf.path.name)
    data.graph_notes = graph_notes(data)
    return data
