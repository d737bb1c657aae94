"""The symmetric adjacency of a graph as CSR arrays built out of core, for partitioning.

:func:`build_symmetric_csr` turns a stream of edge chunks into ``indptr`` (int64
``[N+1]``) and ``indices`` (int32 where ids fit, else int64, ``[nnz]``) in two passes:

1. counting: ``np.bincount`` of both endpoints of every chunk gives each node's degree,
   whose prefix sum is ``indptr``;
2. filling: each chunk's entries (both directions) are sorted stably by row and scattered
   at a per-row cursor, so ``indices[indptr[v]:indptr[v+1]]`` are ``v``'s neighbours.

What the arrays hold: every edge ``u -> v`` with ``u != v`` gives the two entries ``v`` in
row ``u`` and ``u`` in row ``v`` (the graph made undirected). Self loops are dropped (they
never cross a partition). Duplicates are kept: an edge stored in both directions, as an
undirected graph stores it, appears twice in each row, which a partitioner reads as an
edge of weight 2; label propagation and the coarse graph's edge weights only ever count
neighbours, so a uniform doubling changes nothing, and a repeated edge weighs more, as it
should. The order of a row's entries follows the chunk order; the partitioners here only
count, so the result never depends on it.

On disk, the filling pass is an external bucket sort instead (:func:`_fill_by_buckets`):
the entries go to scratch files by row range, and each range is sorted alone and written
into its slice of ``indices``, so the memory map is written once, in order.

Memory: ``8 (N + 1)`` bytes for the degrees/cursors plus about ``40`` bytes per edge of
one chunk (on disk: one bucket's sort, about 24 bytes an entry of
:data:`BUCKET_ENTRIES`); the arrays themselves live in ``.npy`` memory maps inside a
private subdirectory of the caller's work directory (removed by
:meth:`SymmetricCSR.close`), or in memory when no work directory is given (the in-memory
partitioner path). Scratch disk on that path: 2 id-widths an entry, freed bucket by bucket. Written by
hand because no maintained library builds a CSR from a chunked edge list on disk (scipy's
``coo_matrix.tocsr`` needs every edge in memory at once).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from commgnn.errors import PartitionError

EDGE_CHUNK = 1 << 21
"""Edges read per chunk by default (about 80 MB of temporaries in the fill pass)."""

BUCKET_ENTRIES = 1 << 26
"""On disk, the filling pass sorts CSR entries in buckets of about this many (64M: 512 MB
of scratch a bucket, under 2 GB of memory while one is sorted)."""

MAX_BUCKETS = 256
"""At most about this many buckets (two scratch files each are open during the pass)."""

EdgeChunks = Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]]
"""A callable returning a fresh iterator of ``(src, dst)`` integer arrays (it is called
once per pass, so it must be re-iterable)."""


def id_dtype(num_nodes: int) -> type:
    """int32 where node ids fit, else int64."""
    return np.int32 if num_nodes <= np.iinfo(np.int32).max else np.int64


@dataclass
class SymmetricCSR:
    """``indptr [N+1]`` int64 and ``indices [nnz]`` of the symmetrised graph (module docstring).

    On disk they are read-only memory maps; :meth:`close` (or leaving a ``with`` block)
    drops them and removes the private work directory."""

    num_nodes: int
    """N."""
    indptr: np.ndarray
    """``[N+1]`` int64 row offsets."""
    indices: np.ndarray
    """``[nnz]`` neighbour ids (int32 where they fit)."""
    workdir: Path | None = None
    """The private directory holding the memory maps; None when in memory."""
    _closed: bool = field(default=False, repr=False)

    @property
    def nnz(self) -> int:
        return int(self.indptr[-1])

    def close(self) -> None:
        """Drop the arrays and remove the private work directory (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self.indptr = np.zeros(1, dtype=np.int64)
        self.indices = np.zeros(0, dtype=np.int32)
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "SymmetricCSR":
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()


class DegreeCounter:
    """``deg[v] += `` the occurrences of ``v`` in the id arrays given to :meth:`add`, by
    ``np.bincount`` over buffers of at least ``len(deg) / 4`` ids. A bincount costs
    ``O(N)`` whatever its input (its result has ``max id + 1`` entries): once per 2M-edge
    chunk of a 100M-node graph that was the whole counting pass (2 GB of the 8 GB edge
    file read in 5 minutes); buffered, it is ``O(E)``."""

    def __init__(self, deg: np.ndarray) -> None:
        self.deg = deg
        self.pending: list[np.ndarray] = []
        self.held = 0

    def add(self, ids: np.ndarray) -> None:
        self.pending.append(ids)
        self.held += len(ids)
        if self.held >= max(len(self.deg) // 4, 1):
            self.flush()

    def flush(self) -> None:
        """Count what is buffered (call it once more after the last :meth:`add`)."""
        if self.pending:
            b = np.bincount(np.concatenate(self.pending))
            self.deg[:len(b)] += b
        self.pending, self.held = [], 0


def array_edge_chunks(src: np.ndarray, dst: np.ndarray, chunk: int = EDGE_CHUNK) -> EdgeChunks:
    """:data:`EdgeChunks` over two equal-length id arrays (in memory or memory-mapped)."""

    def gen() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for s in range(0, len(src), chunk):
            yield np.asarray(src[s:s + chunk]), np.asarray(dst[s:s + chunk])
    return gen


def folder_edge_chunks(folder: Any, chunk: int = EDGE_CHUNK) -> EdgeChunks:
    """:data:`EdgeChunks` over a :class:`~commgnn.data.ondisk.GraphFolder`'s ``edge_index``,
    in its stored dtype (no int64 copy: half the memory for int32 files)."""
    ei = folder.edge_index
    return array_edge_chunks(ei[0], ei[1], chunk)


def _alloc(workdir: Path | None, name: str, dtype: Any, n: int) -> np.ndarray:
    if workdir is None:
        return np.empty(n, dtype=dtype)
    return np.lib.format.open_memmap(workdir / f"{name}.npy", mode="w+", dtype=dtype, shape=(n,))


def build_symmetric_csr(chunks: EdgeChunks, num_nodes: int, *, workdir: str | Path | None = None) -> SymmetricCSR:
    """The symmetric, self-loop-free CSR of the edges that ``chunks`` yields (module docstring).

    With ``workdir``, the arrays are ``.npy`` memory maps in a new private directory under
    it (memory ``O(N + chunk)``); without, plain arrays. Ids outside ``[0, N)`` raise a
    :class:`PartitionError`."""
    N = int(num_nodes)
    private = Path(tempfile.mkdtemp(prefix="csr-", dir=workdir)) if workdir is not None else None
    try:
        deg = np.zeros(N, dtype=np.int64)
        count = DegreeCounter(deg)
        for src, dst in chunks():
            if len(src) == 0:
                continue
            lo, hi = min(int(src.min()), int(dst.min())), max(int(src.max()), int(dst.max()))
            if lo < 0 or hi >= N:
                raise PartitionError(f"edge_index refers to node {lo if lo < 0 else hi}, outside [0, {N})")
            keep = src != dst
            count.add(src[keep])
            count.add(dst[keep])
        count.flush()
        indptr = _alloc(private, "indptr", np.int64, N + 1)
        indptr[0] = 0
        np.cumsum(deg, out=indptr[1:])
        nnz = int(indptr[-1])
        indices = _alloc(private, "indices", id_dtype(N), nnz)
        dt = id_dtype(N)
        if private is not None:
            del deg
            _fill_by_buckets(chunks, indptr, indices, private, dt)
            indptr.flush()
            indices.flush()
            del indptr, indices
            return SymmetricCSR(num_nodes=N, indptr=np.load(private / "indptr.npy", mmap_mode="r"),
                                indices=np.load(private / "indices.npy", mmap_mode="r"), workdir=private)
        cursor = deg  # reused: cursor[v] = next free slot of row v
        cursor[:] = indptr[:-1]
        for src, dst in chunks():
            rows, cols = _entries(src, dst, dt)
            order = np.argsort(rows, kind="stable")
            rows, cols = rows[order], cols[order]
            del order
            m = len(rows)
            if m == 0:
                continue
            starts = np.flatnonzero(np.concatenate([[True], rows[1:] != rows[:-1]]))
            counts = np.diff(np.append(starts, m))
            urows = rows[starts]
            # slot = the row's cursor + the entry's offset within its run of equal rows
            pos = np.repeat(cursor[urows] - starts, counts) + np.arange(m)
            indices[pos] = cols
            cursor[urows] += counts
        if not np.array_equal(cursor, indptr[1:]):  # the two passes saw different edges
            raise PartitionError("the edge chunks changed between the counting and the filling pass")
        del cursor, deg
        return SymmetricCSR(num_nodes=N, indptr=indptr, indices=indices, workdir=None)
    except BaseException:
        if private is not None:
            shutil.rmtree(private, ignore_errors=True)
        raise


def _entries(src: np.ndarray, dst: np.ndarray, dt: Any) -> tuple[np.ndarray, np.ndarray]:
    """A chunk's CSR entries ``(rows, cols)`` in ``dt``: both directions of every edge but
    self loops, ``[s; d]`` then ``[d; s]`` (the order both filling paths keep)."""
    keep = src != dst
    s, d = src[keep].astype(dt, copy=False), dst[keep].astype(dt, copy=False)
    return np.concatenate([s, d]), np.concatenate([d, s])


def _fill_by_buckets(chunks: EdgeChunks, indptr: np.ndarray, indices: np.ndarray, workdir: Path, dt: Any,
                     bucket_entries: int = BUCKET_ENTRIES) -> None:
    """The filling pass on disk, as an external bucket sort: every chunk's entries are
    appended to the scratch files of their row range (a bucket of about ``bucket_entries``
    entries), then each bucket is sorted by row in memory and written into its contiguous
    slice of ``indices``. Each entry is written twice, sequentially. (Scattering every
    chunk's entries straight into the memory-mapped ``indices`` dirtied pages all over the
    file chunk after chunk: on the papers100M-shaped graph the kernel wrote the 8 GB file
    back about 150 times over, 1.3 TB, and the pass had not ended after 12 minutes.)
    Entries keep the order of the in-memory path: by row, then chunk, then position."""
    N = len(indptr) - 1
    bucket_entries = max(int(bucket_entries), int(indptr[-1]) // MAX_BUCKETS + 1)  # open files stay few
    # bucket b holds rows [lo[b], lo[b + 1])
    starts = np.searchsorted(indptr, np.arange(0, int(indptr[-1]), bucket_entries), side="right") - 1
    lo = np.unique(np.concatenate([[0], starts, [N]]))
    nb = len(lo) - 1
    files = [(open(workdir / f"bucket_{b}.row", "wb"), open(workdir / f"bucket_{b}.col", "wb")) for b in range(nb)]
    try:
        for src, dst in chunks():
            rows, cols = _entries(src, dst, dt)
            if len(rows) == 0:
                continue
            b = np.searchsorted(lo, rows, side="right") - 1
            order = np.argsort(b, kind="stable")
            b, rows, cols = b[order], rows[order], cols[order]
            del order
            cut = np.searchsorted(b, np.arange(nb + 1))
            for k in np.flatnonzero(np.diff(cut)):
                files[k][0].write(rows[cut[k]:cut[k + 1]].tobytes())
                files[k][1].write(cols[cut[k]:cut[k + 1]].tobytes())
    finally:
        for fr, fc in files:
            fr.close()
            fc.close()
    for k in range(nb):
        rf, cf = workdir / f"bucket_{k}.row", workdir / f"bucket_{k}.col"
        rows, cols = np.fromfile(rf, dtype=dt), np.fromfile(cf, dtype=dt)
        rf.unlink()
        cf.unlink()
        a, e = int(indptr[lo[k]]), int(indptr[lo[k + 1]])
        if len(rows) != e - a:
            raise PartitionError("the edge chunks changed between the counting and the filling pass")
        indices[a:e] = cols[np.argsort(rows, kind="stable")]
        del rows, cols


def node_chunks(indptr: np.ndarray, edge_budget: int, max_nodes: int = 1 << 20) -> list[tuple[int, int]]:
    """Consecutive node ranges ``[s, e)`` holding about ``edge_budget`` CSR entries each (at
    most ``max_nodes`` nodes; a single node of higher degree gets a range of its own).
    Depends only on ``indptr``, so the in-memory and on-disk paths cut the same ranges."""
    N = len(indptr) - 1
    out = []
    s = 0
    while s < N:
        target = int(indptr[s]) + edge_budget
        e = int(np.searchsorted(indptr, target, side="right")) - 1
        e = min(max(e, s + 1), s + max_nodes, N)
        out.append((s, e))
        s = e
    return out
