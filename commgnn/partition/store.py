"""Save and load a partition directory (what ``commgnn partition`` writes).

Layout of a directory for P parts::

    meta.json     {"format": "commgnn-partition", "version": 1,
                   "num_parts": P, "num_nodes": N, "num_edges": E, "num_features": F,
                   "num_classes": C,
                   "graph_fingerprint": "<caller's string identifying the graph>",
                   "method": ..., "objective": ..., "seed": ...,   (and any other caller keys)
                   "report": {PartitionReport.to_dict()},
                   "files": {"part_0.pt": "<sha256 hex of the file>", ...}}
    part_{r}.pt   torch.save of a dict: LocalPartition's scalar fields (rank, num_parts,
                  num_nodes_global, num_classes, recv_counts, send_counts) plus its tensors
                  (LocalPartition.tensors()); loadable with weights_only=True.

Version 2 (``"layout": "folders"``, written out of core from a graph folder by
:mod:`commgnn.partition.folders`) holds one folder of memory-mappable ``.npy`` files per
rank instead of ``part_{r}.pt``; :func:`load_meta` and :func:`load_partition` read both
versions, so a caller never needs to know which one a directory is.

A directory is written whole into a hidden temporary sibling and renamed into place, so
readers never see a half-written one; an existing partition directory is replaced only
after the new one is complete. Every problem found while loading is a one-line
:class:`~commgnn.errors.PartitionError` that says how to recover.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

from commgnn.config import one_line_errors
from commgnn.data.validate import all_finite, unusual_tensor
from commgnn.errors import PartitionError
from commgnn.integrity import replace_dir
from commgnn.partition.local import LocalPartition
from commgnn.partition.report import PartitionReport

FORMAT = "commgnn-partition"
VERSION = 1
"""The version :func:`save_partitions` writes (``part_{r}.pt`` files)."""
VERSIONS = (1, 2)
"""Versions :func:`load_meta` and :func:`load_partition` read; 2 is one folder of ``.npy``
files per rank, written out of core (:mod:`commgnn.partition.folders`)."""
_RERUN = "re-run `commgnn partition`"
VERSION_LOADERS: dict[int, Callable[[Path, int, dict[str, Any]], LocalPartition]] = {}
"""Readers of the other versions' rank data, by version, called by :func:`load_partition`
after ``meta.json`` and the caller's expectations are checked: version 2 registers itself
when :mod:`commgnn.partition.folders` is imported (with the package), since that module
builds on this one."""
_SCALARS = ("rank", "num_parts", "num_nodes_global", "num_classes")
_COUNTS = ("recv_counts", "send_counts")
# Must match LocalPartition.tensors(); a test checks that they agree.
_TENSORS = ("global_ids", "halo_global_ids", "send_index", "edge_index", "in_degree",
            "x", "y", "train_mask", "val_mask", "test_mask")


def part_file(rank: int) -> str:
    """File name of rank ``rank``'s partition."""
    return f"part_{rank}.pt"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _short(fp: str) -> str:
    return fp if len(fp) <= 12 else fp[:12] + "…"


def _is_partition_dir(path: Path) -> bool:
    try:
        return json.loads((path / "meta.json").read_text()).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


@one_line_errors
def save_partitions(dir: str | Path, parts_list: list[LocalPartition], meta: dict[str, Any]) -> Path:
    """Write ``parts_list`` (rank order) and ``meta`` to ``dir`` atomically; return the path.

    ``meta`` must hold ``graph_fingerprint`` (str) and may hold any JSON values (``method``,
    ``objective``, ``seed``, ``report`` as a dict or :class:`PartitionReport`, ...); the
    format keys, ``num_parts``, ``num_nodes``, ``num_edges`` and ``files`` are filled in
    here. An existing *partition* directory at ``dir`` is replaced; any other non-empty
    directory is refused rather than deleted.
    """
    path = Path(dir)
    P = len(parts_list)
    if P == 0:
        raise PartitionError("no partitions to save")
    for r, lp in enumerate(parts_list):
        if lp.rank != r or lp.num_parts != P:
            raise PartitionError(f"partition {r} of {P} says rank {lp.rank} of {lp.num_parts}; "
                                 "pass all partitions in rank order")
    if not isinstance(meta.get("graph_fingerprint"), str):
        raise PartitionError("meta needs a string 'graph_fingerprint' identifying the graph")
    derived = {"format": FORMAT, "version": VERSION, "num_parts": P,
               "num_nodes": parts_list[0].num_nodes_global,
               "num_edges": sum(int(lp.edge_index.size(1)) for lp in parts_list),
               "num_features": int(parts_list[0].x.size(1)) if parts_list[0].x.dim() == 2 else 0,
               "num_classes": int(parts_list[0].num_classes)}
    for k, v in derived.items():
        if k in meta and meta[k] != v:
            raise PartitionError(f"meta[{k!r}] = {meta[k]!r} disagrees with the partitions ({v!r})")
    full = {**meta, **derived}
    if isinstance(full.get("report"), PartitionReport):
        full["report"] = full["report"].to_dict()
    try:
        json.dumps(full)  # fail before writing anything
    except (TypeError, ValueError) as exc:
        raise PartitionError(f"partition meta is not JSON-serialisable: {exc}") from None
    if path.exists() and not path.is_dir():
        raise PartitionError(f"cannot write partitions to {path}: it exists and is not a directory")
    if path.is_dir() and any(path.iterdir()) and not _is_partition_dir(path):
        raise PartitionError(f"refusing to overwrite {path}: it is not a commgnn partition directory")

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        files = {}
        for lp in parts_list:
            name = part_file(lp.rank)
            torch.save(_payload(lp), tmp / name)
            files[name] = _sha256(tmp / name)
        full["files"] = files
        (tmp / "meta.json").write_text(json.dumps(full, indent=2) + "\n")
        replace_dir(tmp, path)  # readers see the old directory or the new one, never a mix
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def _payload(lp: LocalPartition) -> dict[str, Any]:
    """What a partition file holds (see the module docstring)."""
    payload: dict[str, Any] = {k: int(getattr(lp, k)) for k in _SCALARS}
    payload.update({k: [int(c) for c in getattr(lp, k)] for k in _COUNTS})
    payload.update({k: t.detach().cpu() for k, t in lp.tensors().items()})
    return payload


def partition_to_bytes(lp: LocalPartition) -> bytes:
    """``lp`` serialised exactly as its partition file would hold it (to send it to its rank)."""
    buf = io.BytesIO()
    torch.save(_payload(lp), buf)
    return buf.getvalue()


@one_line_errors
def partition_from_bytes(blob: bytes, *, rank: int, num_parts: int, num_nodes: int,
                         source: str = "the partition sent by rank 0") -> LocalPartition:
    """Inverse of :func:`partition_to_bytes`, with :func:`load_partition`'s checks."""
    payload = _read_payload(blob, "partition", source)
    lp = _from_payload(payload, "partition", source)
    problem = check_local_partition(lp, rank=rank, num_parts=num_parts, num_nodes=num_nodes)
    if problem:
        raise PartitionError(f"{source} is inconsistent: {problem}")
    return lp


@one_line_errors
def load_meta(dir: str | Path) -> dict[str, Any]:
    """Read and check ``dir/meta.json``; raise a one-line :class:`PartitionError` on any problem."""
    path = Path(dir)
    if not path.is_dir():
        raise PartitionError(f"partition dir not found: {path}; {_RERUN}")
    meta_path = path / "meta.json"
    try:
        text = meta_path.read_bytes()  # decoded by json.loads: bad UTF-8 is a ValueError below
    except FileNotFoundError:
        raise PartitionError(f"{path} is not a partition directory (no meta.json); {_RERUN}") from None
    except OSError as exc:
        raise PartitionError(f"cannot read {meta_path}: {exc.strerror}") from None
    try:
        meta = json.loads(text)
    except ValueError as exc:
        raise PartitionError(f"{meta_path} is not valid JSON ({exc}); {_RERUN}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise PartitionError(f"{meta_path} is not a commgnn partition (format {found!r}); {_RERUN}")
    if meta.get("version") not in VERSIONS:
        raise PartitionError(f"{meta_path} has format version {meta.get('version')!r}, "
                             f"this commgnn reads versions {', '.join(map(str, VERSIONS))}; {_RERUN}")
    if meta["version"] == 2 and meta.get("layout") != "folders":
        raise PartitionError(f"{meta_path} has format version 2 with an unknown layout {meta.get('layout')!r}; "
                             f"{_RERUN}")
    # version 1: one part_{r}.pt file per rank; version 2: one part_{r}/ folder per rank
    entry = part_file if meta["version"] == 1 else (lambda r: f"part_{r}")
    P = meta.get("num_parts")
    checks = [
        (isinstance(P, int) and not isinstance(P, bool) and P > 0, "num_parts"),
        (isinstance(meta.get("num_nodes"), int) and meta["num_nodes"] >= (P if isinstance(P, int) else 0),
         "num_nodes"),
        (isinstance(meta.get("graph_fingerprint"), str), "graph_fingerprint"),
        (isinstance(meta.get("files"), dict) and isinstance(P, int)
         and all(isinstance(meta["files"].get(entry(r)), str) for r in range(P)), "files"),
    ]
    for ok, key in checks:
        if not ok:
            raise PartitionError(f"{meta_path} has a missing or invalid {key!r}; {_RERUN}")
    for key in ("num_features", "num_classes"):  # absent in directories written before they were recorded
        value = meta.get(key)
        if key in meta and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise PartitionError(f"{meta_path} has a missing or invalid {key!r}; {_RERUN}")
    problem = _report_problem(meta.get("report", {}), P)
    if problem:
        raise PartitionError(f"{meta_path} has an invalid 'report' ({problem}); {_RERUN}")
    return meta


_REPORT_COUNTS = ("nodes", "edges", "halo_in", "halo_out", "train_nodes")
"""Per-rank lists of a partition report that callers index by rank (the memory pre-flight)."""


def _report_problem(report: Any, P: int) -> str | None:
    """Why ``meta.json``'s ``report`` cannot be used as :meth:`PartitionReport.to_dict` output,
    or None. Absent per-rank lists are accepted (older directories); present ones must hold
    P non-negative ints (``train_nodes`` may be null)."""
    if not isinstance(report, dict):
        return f"expected an object, got {type(report).__name__}"
    for key in _REPORT_COUNTS:
        if key not in report or (key == "train_nodes" and report[key] is None):
            continue
        counts = report[key]
        if not (isinstance(counts, list) and len(counts) == P
                and all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts)):
            return f"{key} must be a list of {P} non-negative integers"
    return None


@one_line_errors
def load_partition(dir: str | Path, rank: int, *, expected_fingerprint: str | None = None,
                   expected_parts: int | None = None) -> LocalPartition:
    """Load rank ``rank``'s :class:`LocalPartition` from ``dir``, checking it thoroughly.

    ``expected_parts`` (the world size) and ``expected_fingerprint`` (the graph being
    trained on) guard against using a directory made for another run.
    """
    path = Path(dir)
    meta = load_meta(path)
    P = meta["num_parts"]
    if expected_parts is not None and expected_parts != P:
        raise PartitionError(f"partition dir has {P} parts but {expected_parts} were requested; "
                             f"run {P} ranks (--parts {P}), or re-run `commgnn partition` with {expected_parts} parts")
    if expected_fingerprint is not None and expected_fingerprint != meta["graph_fingerprint"]:
        raise PartitionError(f"partition dir was made for a different graph (fingerprint "
                             f"{_short(meta['graph_fingerprint'])} != {_short(expected_fingerprint)}); {_RERUN}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < P:
        raise PartitionError(f"rank {rank!r} outside [0, {P}) for partition dir {path}")
    if meta["version"] in VERSION_LOADERS:  # e.g. 2: one memory-mapped folder per rank
        return VERSION_LOADERS[meta["version"]](path, rank, meta)
    name = part_file(rank)
    try:
        blob = (path / name).read_bytes()
    except FileNotFoundError:
        raise PartitionError(f"partition dir {path} is missing {name}; {_RERUN}") from None
    except OSError as exc:
        raise PartitionError(f"cannot read {path / name}: {exc.strerror}") from None
    if hashlib.sha256(blob).hexdigest() != meta["files"][name]:
        raise PartitionError(f"{name} in {path} is corrupt (sha256 mismatch); {_RERUN}")
    payload = _read_payload(blob, name, path)
    lp = _from_payload(payload, name, path)
    problem = check_local_partition(lp, rank=rank, num_parts=P, num_nodes=meta["num_nodes"],
                                    num_features=meta.get("num_features"), num_classes=meta.get("num_classes"))
    if problem:
        raise PartitionError(f"{name} in {path} is inconsistent: {problem}; {_RERUN}")
    return lp


def _read_payload(blob: bytes, name: str, path: Path | str) -> Any:
    try:
        with torch.sparse.check_sparse_tensor_invariants(enable=True), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # see load_graph_file
            return torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for unreadable files
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PartitionError(f"cannot read {name} in {path}: {first}; {_RERUN}") from None


def _from_payload(payload: Any, name: str, path: Path | str) -> LocalPartition:
    if not isinstance(payload, dict):
        raise PartitionError(f"{name} in {path} does not hold a partition dict; {_RERUN}")
    missing = [k for k in (*_SCALARS, *_COUNTS, *_TENSORS) if k not in payload]
    if missing:
        raise PartitionError(f"{name} in {path} lacks {missing[0]!r}; {_RERUN}")
    bad = [k for k in _SCALARS if isinstance(payload[k], bool) or not isinstance(payload[k], int)]
    bad += [k for k in _COUNTS if not isinstance(payload[k], list)
            or not all(isinstance(c, int) and not isinstance(c, bool) for c in payload[k])]
    bad += [k for k in _TENSORS if not isinstance(payload[k], Tensor)]
    if bad:
        raise PartitionError(f"{name} in {path} has a malformed {bad[0]!r}; {_RERUN}")
    # sparse, meta, quantized or nested tensors: no plain values for the checks below to read
    odd = [problem for k in _TENSORS if (problem := unusual_tensor(k, payload[k]))]
    if odd:
        raise PartitionError(f"{name} in {path}: {odd[0]}; {_RERUN}")
    return LocalPartition(**{k: payload[k] for k in (*_SCALARS, *_COUNTS, *_TENSORS)})


def check_local_partition(lp: LocalPartition, *, rank: int, num_parts: int, num_nodes: int,
                          num_features: int | None = None, num_classes: int | None = None,
                          edges: bool = True, values: bool = True) -> str | None:
    """First violation of the :class:`LocalPartition` contract's basic shape rules, or ``None``.

    Cheap checks only (lengths, dtypes, index ranges, sortedness of ids, finite features,
    labels of split nodes within the classes): enough to catch a file from another run or a
    bug, not a full re-derivation from the graph. ``num_features`` and ``num_classes``
    (recorded in ``meta.json`` since they were added; None = not checked) must be the same
    on every rank, or the ranks' models would not match. ``edges = False`` skips
    ``edge_index`` (a caller that checked the CSR it comes from), ``values = False`` the
    finiteness of ``x`` (rows read on use from a file whose hash was checked).
    """
    P, n_own, n_halo = num_parts, lp.num_owned, lp.num_halo
    if (lp.rank, lp.num_parts, lp.num_nodes_global) != (rank, P, num_nodes):
        return (f"it is rank {lp.rank} of {lp.num_parts} for {lp.num_nodes_global} nodes, "
                f"expected rank {rank} of {P} for {num_nodes}")
    if lp.num_classes <= 0:
        return f"num_classes = {lp.num_classes}"
    if num_classes is not None and lp.num_classes != num_classes:
        return f"num_classes = {lp.num_classes} but meta.json records {num_classes}"
    for k in _COUNTS:
        counts = getattr(lp, k)
        if len(counts) != P or min(counts) < 0 or counts[rank] != 0:
            return f"{k} {counts} is not {P} non-negative counts with 0 at its own rank"
    for k in ("global_ids", "halo_global_ids", "send_index", *(("edge_index",) if edges else ()), "in_degree"):
        if getattr(lp, k).dtype != torch.int64:
            return f"{k} has dtype {getattr(lp, k).dtype}, expected int64"
    g, h = lp.global_ids, lp.halo_global_ids
    if g.dim() != 1 or h.dim() != 1 or n_own == 0:
        return "global_ids / halo_global_ids must be non-empty / 1-D"
    if int(g.min()) < 0 or int(g.max()) >= num_nodes or (n_own > 1 and not bool((g[1:] > g[:-1]).all())):
        return "global_ids are not ascending ids in range"
    if n_halo and (int(h.min()) < 0 or int(h.max()) >= num_nodes):
        return "halo_global_ids out of range"
    if sum(lp.recv_counts) != n_halo:
        return f"sum(recv_counts) = {sum(lp.recv_counts)} but there are {n_halo} halo nodes"
    if lp.send_index.dim() != 1 or sum(lp.send_counts) != lp.send_index.numel():
        return f"sum(send_counts) = {sum(lp.send_counts)} but send_index has {lp.send_index.numel()} rows"
    if lp.send_index.numel() and (int(lp.send_index.min()) < 0 or int(lp.send_index.max()) >= n_own):
        return f"send_index outside [0, {n_own})"
    e = lp.edge_index if edges else None
    if e is not None and (e.dim() != 2 or e.size(0) != 2):
        return f"edge_index has shape {tuple(e.shape)}, expected [2, E]"
    if e is not None and e.numel() and (int(e.min()) < 0 or int(e[0].max()) >= n_own + n_halo
                                        or int(e[1].max()) >= n_own):
        return f"edge_index outside [0, {n_own + n_halo}) x [0, {n_own})"
    if tuple(lp.in_degree.shape) != (n_own + n_halo,):
        return f"in_degree has shape {tuple(lp.in_degree.shape)}, expected ({n_own + n_halo},)"
    if lp.in_degree.numel() and int(lp.in_degree.min()) < 0:
        return "in_degree has negative entries"
    if lp.x.dim() != 2 or lp.x.size(0) != n_own:
        return f"x has shape {tuple(lp.x.shape)}, expected [{n_own}, F]"
    if num_features is not None and lp.x.size(1) != num_features:
        return f"x has {lp.x.size(1)} features but meta.json records {num_features}"
    if not lp.x.dtype.is_floating_point:
        return f"x has dtype {lp.x.dtype}, expected floating point"
    if values and not all_finite(lp.x):
        return "x has NaN/inf values"
    if lp.y.dim() != 1 or lp.y.size(0) != n_own:
        return f"y has shape {tuple(lp.y.shape)}, expected [{n_own}]"
    if lp.y.dtype != torch.int64:
        return f"y has dtype {lp.y.dtype}, expected int64"
    labelled = torch.zeros(n_own, dtype=torch.bool)
    for k in ("train_mask", "val_mask", "test_mask"):
        m = getattr(lp, k)
        if m.dtype != torch.bool or tuple(m.shape) != (n_own,):
            return f"{k} has shape {tuple(m.shape)} / dtype {m.dtype}, expected [{n_own}] bool"
        labelled |= m
    if labelled.any():
        used = lp.y[labelled]
        if int(used.min()) < 0 or int(used.max()) >= lp.num_classes:
            return f"a node in a split has a label outside [0, {lp.num_classes})"
    return None
