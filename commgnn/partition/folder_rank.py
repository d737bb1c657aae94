"""A rank's partition read from its folder, without copies of what it may never use.

:class:`FolderPartition` is a :class:`~commgnn.partition.local.LocalPartition` whose
arrays stay the folder's memory maps, and whose two large fields are made on first use:

* ``edge_index`` (``[2, E_r]`` int64, 16 bytes an edge: 4 GB a rank at 250M in-edges) is
  expanded from the folder's in-CSR only when something reads it (the full-graph forward).
  Mini-batch training reads the CSR itself (:meth:`FolderPartition.in_csr`).
* ``x``, when the partition keeps its features in the graph's ``x.npy``
  (``partition.features = "source"``), is a :class:`SourceRows`: rows are read from that
  file by id when indexed, never gathered into one array (25.6 GB of float16 rows over the
  ranks of a papers100M-shaped graph).
"""

from __future__ import annotations

import mmap
import os
from typing import Any

import numpy as np
import torch
from torch import Tensor

from commgnn.partition.local import LocalPartition


SPAN_MIN_ROWS = 1 << 16
"""Rows a read must ask for before it goes by spans (:func:`read_spans`) instead of page
faults on the memory map (one 4 KB read each, at the disk's random-read rate)."""
SPAN_GAP_BYTES = 1 << 17
"""Ids closer than this in the file are read in one span, the bytes between them included
(cheaper than a seek: 128 KB at 500 MB/s is a quarter of a millisecond)."""
SPAN_MAX_BYTES = 1 << 26
"""The most one span reads at a time (64 MB): its buffer's size."""


def read_spans(path: str, offset: int, dtype: np.dtype, width: int, ids: np.ndarray) -> np.ndarray:
    """``[m, width]`` rows ``ids`` (ascending) of the C-ordered ``[N, width]`` array stored at
    ``offset`` of the file ``path``, read by ``os.pread`` in spans: ids less than
    :data:`SPAN_GAP_BYTES` apart share one read, no read exceeds :data:`SPAN_MAX_BYTES`.
    A layer-wise pass that reads a large, scattered share of a 25.6 GB ``x.npy`` this way
    streams it near the disk's sequential rate (528 MB/s here, against about 25 MB/s
    by page faults). Written by hand: numpy's memory maps have no gather by spans."""
    row = int(np.dtype(dtype).itemsize) * width
    gap, cap = max(1, SPAN_GAP_BYTES // row), max(1, SPAN_MAX_BYTES // row)
    ids = np.asarray(ids, dtype=np.int64)
    cut = (np.diff(ids) > gap) | (np.diff(ids // cap) != 0)
    starts = np.concatenate([[0], np.nonzero(cut)[0] + 1])
    ends = np.concatenate([starts[1:], [len(ids)]])
    out = np.empty((len(ids), width), dtype=dtype)
    fd = os.open(path, os.O_RDONLY)
    try:
        for s, e in zip(starts.tolist(), ends.tolist()):
            lo, hi = int(ids[s]), int(ids[e - 1]) + 1
            buf = os.pread(fd, (hi - lo) * row, offset + lo * row)
            if len(buf) != (hi - lo) * row:
                raise OSError(f"{path}: short read at row {lo} (the file is shorter than its header says)")
            out[s:e] = np.frombuffer(buf, dtype=dtype).reshape(hi - lo, width)[ids[s:e] - lo]
    finally:
        os.close(fd)
    return out


class SourceRows:
    """``[n, F]`` feature rows read on use from a memory-mapped ``x [N, F]`` at the global
    ids ``ids [n]``: ``rows[i] = x[ids[i]]``.

    Implements the part of the tensor interface the mini-batch path uses on its feature
    table (indexing by an integer tensor, a slice or an int; ``shape``, ``dtype``,
    ``device``, ``size``, ``dim``, ``element_size``, ``new_empty``, ``new_zeros``, ``to``);
    anything else (``torch.cat`` of it, arithmetic) is a ``TypeError``, not a silent
    copy. ``to`` a floating dtype other than the stored one reads every row (the
    full-graph forward's conversion). Written by hand: numpy's memory maps gather by id
    into a new array only, and torch has no lazily gathered tensor."""

    def __init__(self, x: np.ndarray, ids: np.ndarray) -> None:
        self._x, self._ids = x, ids
        # Rows are read a few hundred bytes at a time at scattered offsets: the kernel's
        # read-ahead for a faulting page (128 KB and more) read each rank's share of the
        # papers100M-shaped graph's x.npy at 350 MB/s for steps that used 30 MB of it.
        raw = getattr(x, "_mmap", None)
        if raw is not None and hasattr(raw, "madvise") and hasattr(mmap, "MADV_RANDOM"):
            raw.madvise(mmap.MADV_RANDOM)
        self.shape = torch.Size((len(ids), int(x.shape[1])))
        self.dtype = torch.from_numpy(np.empty(0, dtype=x.dtype)).dtype
        self.device = torch.device("cpu")

    def _rows(self, ids: np.ndarray) -> Tensor:
        if len(ids) == 0:
            return torch.empty((0, self.shape[1]), dtype=self.dtype)
        order = np.argsort(ids, kind="stable")  # ascending file offsets: sequential reads
        out = np.empty((len(ids), self.shape[1]), dtype=self._x.dtype)
        path = getattr(self._x, "filename", None)
        if len(ids) >= SPAN_MIN_ROWS and path is not None and self._x.flags.c_contiguous:
            out[order] = read_spans(path, int(getattr(self._x, "offset", 0)), self._x.dtype, int(self.shape[1]),
                                    ids[order])
        else:
            out[order] = self._x[ids[order]]
        return torch.from_numpy(out)

    def __getitem__(self, idx: Any) -> Tensor:
        if isinstance(idx, Tensor):
            if idx.dtype == torch.bool:
                idx = idx.nonzero().flatten()
            return self._rows(np.asarray(self._ids[idx.cpu().numpy()], dtype=np.int64).reshape(-1)) \
                .reshape(*idx.shape, self.shape[1])
        if isinstance(idx, slice):
            return self._rows(np.asarray(self._ids[idx], dtype=np.int64))
        if isinstance(idx, (int, np.integer)):
            return self._rows(np.asarray([self._ids[int(idx)]], dtype=np.int64))[0]
        raise TypeError(f"SourceRows index must be an integer tensor, a slice or an int, not {type(idx).__name__}")

    def __len__(self) -> int:
        return self.shape[0]

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    def dim(self) -> int:
        return 2

    def numel(self) -> int:
        return self.shape[0] * self.shape[1]

    def element_size(self) -> int:
        return int(self._x.dtype.itemsize)

    def new_empty(self, size: Any, *, dtype: torch.dtype | None = None) -> Tensor:
        return torch.empty(size, dtype=dtype or self.dtype)

    def new_zeros(self, size: Any, *, dtype: torch.dtype | None = None) -> Tensor:
        return torch.zeros(size, dtype=dtype or self.dtype)

    def to(self, *args: Any, **kwargs: Any) -> "SourceRows | Tensor":
        """Itself for the CPU and its own dtype; every row read and converted otherwise."""
        target = torch.empty(0, dtype=self.dtype).to(*args, **kwargs)
        if target.dtype == self.dtype and target.device.type == "cpu":
            return self
        return self[:].to(*args, **kwargs)

    def __repr__(self) -> str:
        return f"SourceRows(shape={tuple(self.shape)}, dtype={self.dtype})"


def _expand_csr(indptr: np.ndarray, indices: np.ndarray, rows: int = 1 << 20) -> np.ndarray:
    """The contract's ``edge_index``, int64 ``[2, E]``: the columns widened, the CSR's rows
    expanded, written into one array ``rows`` rows at a time (16 bytes an edge and a chunk,
    where stacking widened copies held 40)."""
    n_own, E = len(indptr) - 1, len(indices)
    out = np.empty((2, E), dtype=np.int64)
    out[0] = indices
    for a in range(0, n_own, rows):
        b = min(a + rows, n_own)
        out[1, indptr[a]:indptr[b]] = np.repeat(np.arange(a, b, dtype=np.int64), np.diff(indptr[a:b + 1]))
    return out


class FolderPartition(LocalPartition):
    """A :class:`LocalPartition` over a rank folder's arrays (module docstring): built with
    ``csr = (indptr, indices)`` instead of ``edge_index``, which is expanded on first read."""

    def __init__(self, *, csr: tuple[np.ndarray, np.ndarray], **fields: Any) -> None:
        self._csr = csr
        super().__init__(edge_index=None, **fields)  # type: ignore[arg-type]

    @property  # type: ignore[override]
    def edge_index(self) -> Tensor:
        if self._edge_index is None:
            self._edge_index = torch.from_numpy(_expand_csr(*self._csr))
        return self._edge_index

    @edge_index.setter
    def edge_index(self, value: Tensor | None) -> None:
        self._edge_index = value

    @property
    def num_edges(self) -> int:
        return len(self._csr[1])

    def in_csr(self) -> tuple[Tensor, Tensor]:
        indptr, indices = self._csr
        return torch.from_numpy(indptr), torch.from_numpy(indices)

    def to(self, device: torch.device | str) -> LocalPartition:
        """Itself on the CPU (nothing is copied or expanded); a plain copy elsewhere."""
        if torch.device(device).type == "cpu":
            return self
        return super().to(device)
