"""Sanity checks, notes and a content fingerprint for loaded graphs.

:func:`validate_graph` catches malformed graphs (mostly user ``.pt`` files) at load time
with one-line :class:`~commgnn.errors.DataError` messages that name the field and the first
offending index, instead of an index error deep inside partitioning or training.
:func:`graph_notes` counts what is allowed but worth reporting (isolated nodes, self
loops). :func:`fingerprint` identifies a graph's content, so a saved partition or a result
can be checked against the graph it was made from.
"""

from __future__ import annotations

import hashlib
import warnings

import torch
from torch import Tensor
from torch_geometric.data import Data

from commgnn.errors import DataError

MASK_NAMES = ("train_mask", "val_mask", "test_mask")

DEFAULT_MAX_CLASSES = 1000
"""Default of ``data.max_classes``: more classes than this is taken for a broken label."""

_INTEGER_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


ROW_CHUNK = 65536
"""Rows per chunk of the element-wise checks over a feature matrix."""


def all_finite(x: Tensor, rows: int = ROW_CHUNK) -> bool:
    """No NaN/inf in ``x [N, ...]``, checked ``rows`` rows at a time: torch's CPU kernels
    compute a float16 comparison through a float32 copy of the whole input (+1.6 GB on a
    rank's 2.57M x 128 float16 rows, measured), where a chunk costs a chunk."""
    return all(bool(torch.isfinite(x[a:a + rows]).all()) for a in range(0, x.shape[0], rows))


def count_nonzero(x: Tensor, rows: int = ROW_CHUNK) -> int:
    """Non-zero entries of ``x [N, ...]``, counted ``rows`` rows at a time (see :func:`all_finite`)."""
    return sum(int(torch.count_nonzero(x[a:a + rows])) for a in range(0, x.shape[0], rows))


def _first(flags: Tensor) -> int:
    """Index of the first True in a 1-D bool tensor (which must have one)."""
    return int(flags.nonzero()[0, 0])


def _nodes(count: int, noun: str) -> str:
    """``"1 node"``, ``"3 nodes"``."""
    return f"{count} {noun}" + ("" if count == 1 else "s")


_LAYOUT_HINTS = {"edge_index": "a sparse adjacency A gives edge_index = A.coalesce().indices()"}


def unusual_tensor(key: str, t: Tensor, *, dense_ok: bool = False) -> str | None:
    """Why the graph field ``key`` cannot be used as it is (a one-line reason), or None for
    a plain dense CPU-readable tensor: sparse (COO, CSR, CSC, BSR, BSC) and other
    non-strided layouts, meta, quantized and nested tensors. With ``dense_ok`` a sparse
    layout passes (the caller densifies it: sparse node features)."""
    kind = "meta" if t.is_meta else "quantized" if t.is_quantized else "nested" if t.is_nested else None
    if kind:  # no plain values to check or train on
        return f"{key} is a {kind} tensor; save plain tensors"
    if t.layout != torch.strided and not (dense_ok and t.layout in _SPARSE_LAYOUTS):
        hint = _LAYOUT_HINTS.get(key, f"convert it with {key}.to_dense()")
        return f"{key} has layout {t.layout} but must be a dense (strided) tensor ({hint})"
    return None


_SPARSE_LAYOUTS = (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)


def mask_as_bool(name: str, mask: object, n: int) -> Tensor:
    """A split mask given by a user as a 1-D bool tensor of length ``n``.

    Bool masks are kept; integer masks holding only 0 and 1 are converted to bool (a
    common way to save masks from numpy or pandas). Anything else (float masks, other
    integer values, wrong shape or length) is a one-line :class:`DataError` naming
    ``name`` and, for bad values, the first offending node.
    """
    if not isinstance(mask, Tensor):
        raise DataError(f"{name} must be a tensor, got {type(mask).__name__}")
    if mask.dim() != 1 or mask.numel() != n:
        raise DataError(f"{name} must be a 1-D bool tensor of length {n}, got shape "
                        f"{list(mask.shape)} and dtype {mask.dtype}")
    if mask.dtype == torch.bool:
        return mask
    if mask.dtype not in _INTEGER_DTYPES:
        raise DataError(f"{name} must be a bool tensor (or integers 0/1), got dtype {mask.dtype}")
    bad = (mask != 0) & (mask != 1)
    if bad.any():
        i = _first(bad)
        raise DataError(f"{name} must hold only 0/1 (or be bool), got value {int(mask[i])} "
                        f"at node {i}")
    return mask.bool()


def graph_notes(data: Data) -> dict[str, int]:
    """Counts of allowed but noteworthy features of a graph, for the run manifest.

    Returns ``{"isolated_nodes": int, "self_loops": int}``: ``self_loops`` is the number
    of stored edges ``(i, i)``; ``isolated_nodes`` the number of nodes with no edge to or
    from another node (a node whose only edges are self loops counts as isolated, since
    :func:`~commgnn.data.load_dataset` drops self loops). Assumes ``edge_index`` holds
    valid ids (call it after :func:`validate_graph`).
    """
    edge_index = data.edge_index
    n = int(data.num_nodes)
    loops = edge_index[0] == edge_index[1]
    connected = torch.zeros(n, dtype=torch.bool)
    proper = edge_index[:, ~loops]
    connected[proper[0]] = True
    connected[proper[1]] = True
    return {"isolated_nodes": int(n - int(connected.sum())), "self_loops": int(loops.sum())}


def validate_graph(data: Data, *, max_classes: int = DEFAULT_MAX_CLASSES,
                   allow_mask_overlap: bool = False) -> dict[str, int]:
    """Raise a one-line :class:`DataError` unless ``data`` is a usable node-classification graph.

    Checks, in this order, each message naming the field and the first offending index:

    * ``x``, ``edge_index`` and ``y`` are tensors and there is at least one node; they and
      the masks are plain dense tensors (:func:`unusual_tensor`: no sparse layout);
    * ``edge_index`` is ``[2, E]`` integer with ids in ``[0, N)``;
    * ``x`` is ``[N, F]`` floating point without NaN/inf;
    * ``y`` is ``[N]`` integer (``y < 0`` means unlabelled);
    * the three masks are 1-D bool of length N (loaders convert 0/1 integer masks with
      :func:`mask_as_bool`; this function does not change ``data``);
    * the training, validation and test sets are non-empty and hold no unlabelled node;
    * the class count (``num_classes_total`` where set, else ``max(y) + 1``) is at most
      ``max_classes`` (``data.max_classes``), and no label reaches ``num_classes_total``;
    * the masks are pairwise disjoint; with ``allow_mask_overlap`` an overlap is only a
      :class:`UserWarning` and validation goes on.

    Returns:
        :func:`graph_notes` of the graph: ``{"isolated_nodes": int, "self_loops": int}``.
    """
    x, edge_index, y = data.get("x"), data.get("edge_index"), data.get("y")
    for key, value in (("x", x), ("edge_index", edge_index), ("y", y)):
        if not isinstance(value, Tensor):
            raise DataError(f"graph has no tensor '{key}'")
    for key in ("x", "edge_index", "y", *MASK_NAMES):
        value = data.get(key)
        problem = unusual_tensor(key, value) if isinstance(value, Tensor) else None
        if problem:
            raise DataError(f"graph field {problem}")
    n = data.num_nodes
    if not n:
        raise DataError("graph has zero nodes")

    if (edge_index.dim() != 2 or edge_index.size(0) != 2
            or edge_index.dtype.is_floating_point or edge_index.dtype == torch.bool
            or edge_index.is_complex()):
        raise DataError(f"edge_index must be a [2, E] integer tensor, got shape "
                        f"{list(edge_index.shape)} and dtype {edge_index.dtype}")
    if edge_index.numel():
        lo, hi = int(edge_index.min()), int(edge_index.max())
        if lo < 0:
            col = _first((edge_index < 0).any(dim=0))
            raise DataError(f"edge_index has negative node id {lo}, first negative id at edge "
                            f"{col} ({int(edge_index[0, col])} -> {int(edge_index[1, col])})")
        if hi >= n:
            col = _first((edge_index >= n).any(dim=0))
            raise DataError(f"edge_index has node id {hi} but the graph has {n} nodes, first "
                            f"out-of-range id at edge {col} ({int(edge_index[0, col])} -> "
                            f"{int(edge_index[1, col])})")

    if x.dim() != 2 or x.size(0) != n:
        raise DataError(f"x must be [N, F] with N = {n} nodes, got shape {list(x.shape)}")
    if not x.dtype.is_floating_point:
        raise DataError(f"x must be floating point, got dtype {x.dtype}")
    bad = ~torch.isfinite(x)
    if bad.any():
        rows = bad.any(dim=1).nonzero().view(-1)
        raise DataError(f"x has {int(bad.sum())} NaN/inf values, first at node {int(rows[0])}")

    if y.dim() != 1 or y.numel() != n:
        raise DataError(f"y must have one label per node ({n}), got shape {list(y.shape)}")
    if y.dtype not in _INTEGER_DTYPES:
        raise DataError(f"y must hold integer class labels, got dtype {y.dtype}")
    masks: dict[str, Tensor] = {}
    for name in MASK_NAMES:
        mask = data.get(name)
        if not isinstance(mask, Tensor):
            raise DataError(f"graph has no tensor '{name}'")
        if mask.dtype != torch.bool or mask.dim() != 1 or mask.numel() != n:
            raise DataError(f"{name} must be a 1-D bool tensor of length {n}, got shape "
                            f"{list(mask.shape)} and dtype {mask.dtype}")
        masks[name] = mask

    _check_split(masks, y)
    _check_classes(data, y, max_classes)
    _check_overlap(masks, allow_mask_overlap)
    return graph_notes(data)


def _check_split(masks: dict[str, Tensor], y: Tensor) -> None:
    """Every set non-empty and labelled."""
    if not masks["train_mask"].any():
        raise DataError("graph has no training nodes (train_mask is all False)")
    hints = {"val_mask": ("validation", "raise data.val_ratio"),
             "test_mask": ("test", "lower data.train_ratio + data.val_ratio below 1")}
    for name, (what, fix) in hints.items():
        if not masks[name].any():
            raise DataError(f"graph has no {what} nodes ({name} is all False): for a generated "
                            f"split {fix} (or use a larger graph); for a .pt graph put nodes "
                            f"in {name}")
    unlabelled = y < 0
    for name in MASK_NAMES:
        bad = masks[name] & unlabelled
        if bad.any():
            count = _nodes(int(bad.sum()), "unlabelled node")
            raise DataError(f"{name} contains {count} (label < 0), first at node {_first(bad)}")


def _check_classes(data: Data, y: Tensor, max_classes: int) -> None:
    """Class count within ``max_classes``; labels below ``num_classes_total``."""
    too_big = y >= max_classes
    if too_big.any():
        i = _first(too_big)
        top = int(y.max())
        raise DataError(f"y has label {int(y[i])} at node {i} (max label {top}), so the graph "
                        f"would have {top + 1} classes, more than data.max_classes = "
                        f"{max_classes} (fix the labels, or raise data.max_classes)")
    total = data.get("num_classes_total")
    if total is None:
        return
    try:
        total = int(total)
    except (TypeError, ValueError, RuntimeError):
        raise DataError(f"num_classes_total must be an integer, got {total!r:.60}") from None
    if total > max_classes:
        raise DataError(f"num_classes_total = {total} is more than data.max_classes = "
                        f"{max_classes} (raise data.max_classes if that many classes is intended)")
    over = y >= total
    if over.any():
        i = _first(over)
        raise DataError(f"y has label {int(y[i])} at node {i} but num_classes_total = {total} "
                        f"(labels must lie in [0, {total}), or be < 0 for unlabelled)")


def _check_overlap(masks: dict[str, Tensor], allow: bool) -> None:
    """Masks pairwise disjoint, or a warning with ``allow``."""
    pairs = (("train_mask", "val_mask"), ("train_mask", "test_mask"), ("val_mask", "test_mask"))
    for a, b in pairs:
        shared = masks[a] & masks[b]
        if not shared.any():
            continue
        count = _nodes(int(shared.sum()), "node")
        what = f"{a} and {b} share {count}, first at node {_first(shared)}"
        if not allow:
            raise DataError(f"{what} (make the masks disjoint, or set data.allow_mask_overlap "
                            f"= true to accept it)")
        warnings.warn(f"{what}; accepted because data.allow_mask_overlap = true", UserWarning,
                      stacklevel=3)


def fingerprint(data: Data) -> str:
    """First 16 hex digits of a SHA-256 over the graph's content.

    Covers the node count, ``edge_index``, ``x`` (shape, dtype and bytes), ``y`` and the
    three masks, in that order, so any change to topology, features, labels or split
    changes it. Hashes the tensors' memory directly (no copy for contiguous CPU tensors):
    about a second for 1M nodes x 64 float32 features and 20M edges.
    """
    h = hashlib.sha256()
    h.update(f"nodes={data.num_nodes};".encode())
    for name in ("edge_index", "x", "y", *MASK_NAMES):
        value = data.get(name)
        if value is None:
            h.update(f"{name}=None;".encode())
            continue
        h.update(f"{name}:{list(value.shape)}:{value.dtype};".encode())
        h.update(_bytes_view(value))
    return h.hexdigest()[:16]


def _bytes_view(t: Tensor) -> memoryview:
    """The tensor's bytes without copying where possible (bool/float16 via a uint8 view)."""
    t = t.detach().cpu().contiguous().reshape(-1)
    return memoryview(t.view(torch.uint8).numpy()) if t.numel() else memoryview(b"")
