"""Partition directories of format version 2: one folder of memory-mappable ``.npy`` files
per rank, written out of core from a :class:`~commgnn.data.ondisk.GraphFolder`.

Layout for P parts::

    meta.json        {"format": "commgnn-partition", "version": 2, "layout": "folders",
                      "num_parts", "num_nodes", "num_edges", "num_features", "num_classes",
                      "graph_fingerprint", "method", "seed", ..., "report": {...},
                      "files": {"part_0": "<sha256 of part_0/meta.json>", ...}}
    part_{r}/meta.json    rank, num_parts, num_nodes_global, num_classes, recv_counts,
                          send_counts, num_owned, num_halo, num_edges, num_features,
                          "files": {"<name>.npy": "<sha256>"}, and "x_source" when the
                          features stay in the graph folder (see below)
    part_{r}/global_ids.npy       [n_own] int64, ascending
    part_{r}/halo_global_ids.npy  [n_halo] int64, by (owner rank, global id)
    part_{r}/send_index.npy       [sum(send_counts)] int64 owned rows, by (peer, global id)
    part_{r}/indptr.npy           [n_own + 1] int64: in-CSR over the owned targets
    part_{r}/indices.npy          local sources (int32 where n_own + n_halo fits), each row
                                  ascending: the columns of LocalPartition.edge_index
    part_{r}/in_degree.npy        [n_own + n_halo] int64 global in-degrees
    part_{r}/x.npy                [n_own, F] owned feature rows (the graph's dtype)
    part_{r}/y.npy                [n_own] int64
    part_{r}/{train,val,test}_mask.npy   [n_own] bool

These are exactly the fields of :func:`commgnn.partition.build.build_local_partitions`'s
:class:`~commgnn.partition.local.LocalPartition` for the same assignment (``edge_index``
stored as its CSR). With ``copy_features=False`` there is no ``x.npy``: ``x_source``
records the graph's ``x.npy`` (absolute path, size, shape, dtype, sha256 computed once
here) and a rank gathers its rows from it by id.

Writing (:func:`write_partition_folders`) is out of core: a first pass over the edge
chunks counts in-degrees; a second buckets every edge by its target into scratch files,
a bucket being a run of consecutive owned rows of one rank with about
:data:`RANK_EDGES` in-edges; then, rank by rank, the buckets are read twice: once to
collect the halo, once to sort each bucket's edges into its slice of the in-CSR (written
to a memory map); the owned feature rows are copied chunk by chunk; a last pass per rank
assembles its send plan from the other ranks' halo blocks. Peak memory: ``O(N)`` per-node
arrays (part, local row, in-degree, masks, bucket), one rank's halo keys, and one bucket
or chunk of edges (about 40 bytes per edge), whatever the graph's size.
Each rank folder is written under a temporary name and renamed when complete, inside a
hidden temporary directory that is renamed into place after the top-level ``meta.json``
is written last, so a stopped run never leaves a folder that looks complete.

:func:`load_rank_folder` reads one rank's folder only: it checks the chain of hashes
(top-level ``meta.json`` -> the rank's ``meta.json`` -> every file, streamed), then
memory-maps the arrays (``mmap_mode="c"``: file-backed pages, copy-on-write, so torch may
wrap them); ``edge_index`` is expanded from the CSR, as the contract wants it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from commgnn.config import one_line_errors
from commgnn.integrity import replace_dir
from commgnn.errors import PartitionError
from commgnn.partition.disk_csr import EDGE_CHUNK, DegreeCounter, folder_edge_chunks, id_dtype
from commgnn.partition.folder_rank import FolderPartition, SourceRows
from commgnn.partition.local import LocalPartition
from commgnn.partition.report import PartitionReport, _balance
from commgnn.partition.store import (FORMAT, _RERUN, VERSION_LOADERS, _is_partition_dir, _sha256,
                                     check_local_partition, load_meta, load_partition)

VERSION = 2
LAYOUT = "folders"
ROW_BYTES = 1 << 26
"""Feature bytes copied per step (64 MiB)."""
RANK_EDGES = 1 << 24
"""A rank's edges are sorted into its in-CSR in buckets of about this many (plus one node's
in-degree at most): the writer's peak memory per edge applies to a bucket, not to a rank."""
MAX_BUCKETS = 256
"""At most about this many buckets (two scratch files each are open during the edge pass)."""
_ARRAYS = ("global_ids", "halo_global_ids", "send_index", "indptr", "indices", "in_degree",
           "x", "y", "train_mask", "val_mask", "test_mask")
_MASKS = {"train_mask": "train", "val_mask": "valid", "test_mask": "test"}


def rank_dir(rank: int) -> str:
    """Name of rank ``rank``'s folder inside a version-2 partition directory."""
    return f"part_{rank}"


def _check_parts(parts: Any, N: int, P: int) -> np.ndarray:
    parts = np.asarray(parts.numpy() if isinstance(parts, torch.Tensor) else parts)
    if parts.shape != (N,) or not np.issubdtype(parts.dtype, np.integer):
        raise PartitionError(f"part ids must be [{N}] integers (one per node), got {parts.dtype} {list(parts.shape)}")
    if isinstance(P, bool) or not isinstance(P, int) or P <= 0:
        raise PartitionError(f"num_parts must be a positive int, got {P!r}")
    parts = parts.astype(np.int64)
    if N and (parts.min() < 0 or parts.max() >= P):
        raise PartitionError(f"part id {int(parts.min() if parts.min() < 0 else parts.max())} outside [0, {P})")
    empty = np.flatnonzero(np.bincount(parts, minlength=P) == 0)
    if len(empty):
        raise PartitionError(f"partition {int(empty[0])} of {P} is empty ({len(empty)} empty in all); use fewer parts")
    return parts


def _save(path: Path, arr: np.ndarray) -> None:
    np.save(path, np.ascontiguousarray(arr), allow_pickle=False)


def _runs(keys: np.ndarray, P: int) -> np.ndarray:
    """``[P+1]`` offsets of the runs of ``keys`` (sorted ints in ``[0, P)``)."""
    return np.searchsorted(keys, np.arange(P + 1))


@one_line_errors
def write_partition_folders(folder: Any, parts: Any, num_parts: int, out: str | Path, *, meta: dict[str, Any],
                            copy_features: bool = True, chunk: int = EDGE_CHUNK,
                            workdir: str | Path | None = None, rank_edges: int = RANK_EDGES) -> Path:
    """Write the version-2 partition directory of ``folder`` (a
    :class:`~commgnn.data.ondisk.GraphFolder`) split by ``parts`` (``[N]`` ids in
    ``[0, num_parts)``, every part non-empty) to ``out``; return ``out``.

    ``meta`` must hold ``graph_fingerprint`` (str) and may hold any JSON values; the format
    keys, sizes, ``report`` (a :class:`PartitionReport`'s dict, computed here chunk-wise)
    and ``files`` are filled in. Scratch files go to a private directory under
    ``workdir`` (default: ``out``'s parent) and are removed. An existing partition
    directory at ``out`` is replaced once the new one is complete; any other non-empty
    directory is refused."""
    out = Path(out).expanduser()
    N, P = folder.num_nodes, num_parts
    parts = _check_parts(parts, N, P)
    if not isinstance(meta.get("graph_fingerprint"), str):
        raise PartitionError("meta needs a string 'graph_fingerprint' identifying the graph")
    if out.exists() and not out.is_dir():
        raise PartitionError(f"cannot write partitions to {out}: it exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not _is_partition_dir(out):
        raise PartitionError(f"refusing to overwrite {out}: it is not a commgnn partition directory")
    try:
        json.dumps(meta)  # fail before the long write
    except (TypeError, ValueError) as exc:
        raise PartitionError(f"partition meta is not JSON-serialisable: {exc}") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    if workdir:
        Path(workdir).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.scratch-", dir=workdir if workdir else out.parent))
    try:
        report, rank_hashes = _write(folder, parts, P, tmp, scratch, copy_features=copy_features, chunk=chunk,
                                      rank_edges=rank_edges)
        shutil.rmtree(scratch, ignore_errors=True)
        full = {**{k: v for k, v in meta.items() if k != "report"},
                "format": FORMAT, "version": VERSION, "layout": LAYOUT, "num_parts": P, "num_nodes": N,
                "num_edges": folder.num_edges, "num_features": folder.num_features,
                "num_classes": folder.num_classes, "copy_features": bool(copy_features),
                "report": report.to_dict(), "files": rank_hashes}
        # last: its presence marks the directory complete
        (tmp / "meta.json").write_text(json.dumps(full, indent=2) + "\n")
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return out


def _write(folder: Any, parts: np.ndarray, P: int, tmp: Path, scratch: Path, *, copy_features: bool,
           chunk: int, rank_edges: int) -> tuple[PartitionReport, dict[str, str]]:
    N = folder.num_nodes
    dt = id_dtype(N)
    # Local numbering: part r's nodes in ascending id are rows 0 .. n_own-1 (build.py's step 1).
    order = np.argsort(parts, kind="stable")
    sizes = np.bincount(parts, minlength=P)
    own_start = np.concatenate([[0], np.cumsum(sizes)])
    local_row = np.empty(N, dtype=np.int64)
    local_row[order] = np.arange(N, dtype=np.int64) - own_start[parts[order]]

    # Pass 0 over the edges: in-degrees (they size the buckets and the in-CSR's rows).
    in_deg = np.zeros(N, dtype=np.int64)
    count = DegreeCounter(in_deg)
    for src, dst in folder_edge_chunks(folder, chunk)():
        if len(src) == 0:
            continue
        lo, hi = min(int(src.min()), int(dst.min())), max(int(src.max()), int(dst.max()))
        if lo < 0 or hi >= N:
            raise PartitionError(f"{folder.path / 'edge_index.npy'} refers to node {lo if lo < 0 else hi}, "
                                 f"outside [0, {N})")
        count.add(dst)
    count.flush()
    # Buckets: runs of consecutive owned rows of one rank holding about `rank_edges` in-edges
    # (one rank's edges need not fit in memory at once). In grouped order (rank, local row),
    # a node's bucket is (its rank, edges before it within its rank // rank_edges).
    rank_edges = max(int(rank_edges), folder.num_edges // MAX_BUCKETS + 1)
    # in place, one [N] temporary at a time: sub = in-edges before the node within its rank // rank_edges
    sub = in_deg[order]
    np.cumsum(sub, out=sub)
    for r in range(P):  # exclusive prefix within the rank
        lo_, hi_ = own_start[r], own_start[r + 1]
        if hi_ > lo_:
            sub[lo_:hi_] -= sub[lo_] - in_deg[order[lo_]]
    sub -= in_deg[order]
    sub //= rank_edges
    rank_g = parts[order]
    sub += rank_g * (int(sub.max()) + 1 if N else 1)  # the bucket key (rank, sub), ascending
    first_pos = np.flatnonzero(np.concatenate([[True], sub[1:] != sub[:-1]]))
    del sub
    nb = len(first_pos)
    bucket_rank = rank_g[first_pos]
    del rank_g
    rank_buckets = np.searchsorted(bucket_rank, np.arange(P + 1))
    bucket_of = np.empty(N, dtype=np.int32)
    bucket_of[order] = np.repeat(np.arange(nb, dtype=np.int32), np.diff(np.append(first_pos, N)))

    # Pass 1: bucket every edge by its target's bucket; count the cut columns.
    cut_directed = 0
    files = [(open(scratch / f"src_{k}.bin", "wb"), open(scratch / f"dst_{k}.bin", "wb")) for k in range(nb)]
    try:
        for src, dst in folder_edge_chunks(folder, chunk)():
            if len(src) == 0:
                continue
            cut_directed += int(np.count_nonzero(parts[src] != parts[dst]))
            tb = bucket_of[dst]
            o = np.argsort(tb, kind="stable")
            bounds = _runs(tb[o], nb)
            s_sorted, d_sorted = src[o].astype(dt, copy=False), dst[o].astype(dt, copy=False)
            for k in np.flatnonzero(np.diff(bounds)):
                files[k][0].write(s_sorted[bounds[k]:bounds[k + 1]].tobytes())
                files[k][1].write(d_sorted[bounds[k]:bounds[k + 1]].tobytes())
    finally:
        for fs, fd in files:
            fs.close()
            fd.close()
    del bucket_of

    masks = {}
    for name, split in _MASKS.items():
        m = np.zeros(N, dtype=bool)
        ids = np.asarray(folder.split(split))
        if len(ids) and (ids.min() < 0 or ids.max() >= N):
            raise PartitionError(f"{folder.path / 'split' / (split + '.npy')} holds node ids outside [0, {N})")
        m[ids] = True
        masks[name] = m
    x_src = folder.x
    x_source = None
    if not copy_features:
        xp = (folder.path / "x.npy").resolve()
        x_source = {"path": str(xp), "size": xp.stat().st_size, "shape": list(x_src.shape),
                    "dtype": str(x_src.dtype), "sha256": _sha256(xp)}

    # Pass A, per rank: halo, local in-CSR, per-node arrays; the halo blocks go to scratch.
    recv = np.zeros((P, P), dtype=np.int64)  # [receiver, owner]
    edges = np.zeros(P, dtype=np.int64)
    cut_files = [open(scratch / f"cut_{r}.bin", "wb") for r in range(P)]
    try:
        for r in range(P):
            rd = tmp / f".{rank_dir(r)}.tmp"
            rd.mkdir()
            gids = order[own_start[r]:own_start[r + 1]]
            n_own = len(gids)
            buckets = range(rank_buckets[r], rank_buckets[r + 1])

            def read(k: int) -> tuple[np.ndarray, np.ndarray]:
                return (np.fromfile(scratch / f"src_{k}.bin", dtype=dt).astype(np.int64),
                        np.fromfile(scratch / f"dst_{k}.bin", dtype=dt).astype(np.int64))

            # The rank's halo: (owner, global id) keys of cross sources, merged bucket by bucket.
            found: list[np.ndarray] = []
            for k in buckets:
                src, _ = read(k)
                sp = parts[src]
                cross = sp != r
                found.append(np.unique(sp[cross] * N + src[cross]))
                if len(found) > 8:
                    found = [np.unique(np.concatenate(found))]
            hkeys = np.unique(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)
            del found
            howner, hgid = hkeys // N, hkeys % N
            n_halo = len(hkeys)
            hb = _runs(howner, P)
            recv[r] = np.diff(hb)
            for q in range(P):
                if hb[q + 1] > hb[q]:
                    hgid[hb[q]:hb[q + 1]].tofile(scratch / f"send_{q}_{r}.bin")

            # The in-CSR: a bucket's targets are consecutive rows, so its sorted edges are one
            # contiguous slice of `indices`, starting at the row offset of its first row.
            indptr = np.zeros(n_own + 1, dtype=np.int64)
            np.cumsum(in_deg[gids], out=indptr[1:])
            edges[r] = indptr[-1]
            M = n_own + n_halo
            indices = np.lib.format.open_memmap(rd / "indices.npy", mode="w+", dtype=id_dtype(M),
                                                shape=(int(indptr[-1]),))
            for k in buckets:
                src, dst = read(k)
                (scratch / f"src_{k}.bin").unlink()
                (scratch / f"dst_{k}.bin").unlink()
                sp = parts[src]
                cross = np.flatnonzero(sp != r)
                # unordered cut pairs, routed to the part of the lower id so each is counted once
                lo_, hi_ = np.minimum(src[cross], dst[cross]), np.maximum(src[cross], dst[cross])
                pk = np.unique(lo_ * N + hi_)
                pp = parts[pk // N]
                o = np.argsort(pp, kind="stable")
                pb = _runs(pp[o], P)
                pk = pk[o]
                for q in range(P):
                    cut_files[q].write(pk[pb[q]:pb[q + 1]].tobytes())
                del lo_, hi_, pk, pp, o
                ls = local_row[src]
                ls[cross] = n_own + np.searchsorted(hkeys, sp[cross] * N + src[cross])
                del src, sp, cross
                key = local_row[dst] * M + ls
                del dst, ls
                key.sort()
                off = int(indptr[first_pos[k] - own_start[r]])
                indices[off:off + len(key)] = key % M
                del key
            indices.flush()
            del indices
            _save(rd / "indptr.npy", indptr)
            del indptr
            _save(rd / "global_ids.npy", gids)
            _save(rd / "halo_global_ids.npy", hgid)
            _save(rd / "in_degree.npy", np.concatenate([in_deg[gids], in_deg[hgid]]))
            _save(rd / "y.npy", np.asarray(folder.y[gids]).astype(np.int64))
            for name, m in masks.items():
                _save(rd / f"{name}.npy", m[gids])
            if copy_features:
                F = folder.num_features
                xo = np.lib.format.open_memmap(rd / "x.npy", mode="w+", dtype=x_src.dtype, shape=(n_own, F))
                step = max(1, ROW_BYTES // max(1, F * x_src.dtype.itemsize))
                for s in range(0, n_own, step):
                    xo[s:s + step] = x_src[gids[s:s + step]]
                xo.flush()
                del xo
            del hkeys, howner, hgid
    finally:
        for f in cut_files:
            f.close()

    # Pass B, per rank: send plan from the peers' halo blocks, then meta.json and the rename.
    rank_hashes = {}
    send = recv.T  # send[q, r] = rows q sends to r = recv[r, q]
    for q in range(P):
        rd = tmp / f".{rank_dir(q)}.tmp"
        blocks = []
        for r in range(P):
            f = scratch / f"send_{q}_{r}.bin"
            if send[q, r]:
                blocks.append(local_row[np.fromfile(f, dtype=np.int64)])
                f.unlink()
        _save(rd / "send_index.npy", np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.int64))
        names = [n for n in _ARRAYS if copy_features or n != "x"]
        rmeta: dict[str, Any] = {
            "rank": q, "num_parts": P, "num_nodes_global": N, "num_classes": folder.num_classes,
            "recv_counts": [int(c) for c in recv[q]], "send_counts": [int(c) for c in send[q]],
            "num_owned": int(sizes[q]), "num_halo": int(recv[q].sum()), "num_edges": int(edges[q]),
            "num_features": folder.num_features,
            "files": {f"{n}.npy": _sha256(rd / f"{n}.npy") for n in names}}
        if x_source is not None:
            rmeta["x_source"] = x_source
        (rd / "meta.json").write_text(json.dumps(rmeta, indent=1) + "\n")
        rank_hashes[rank_dir(q)] = _sha256(rd / "meta.json")
        os.rename(rd, tmp / rank_dir(q))

    edge_cut = 0
    for q in range(P):
        edge_cut += len(np.unique(np.fromfile(scratch / f"cut_{q}.bin", dtype=np.int64)))
    halo_in, halo_out = recv.sum(1), recv.sum(0)
    train = np.bincount(parts[masks["train_mask"]], minlength=P)
    report = PartitionReport(
        num_parts=P, num_nodes=N, num_edges=folder.num_edges, edge_cut=edge_cut,
        cut_edges_directed=cut_directed, comm_volume=int(halo_in.sum()),
        halo_in=tuple(int(c) for c in halo_in), halo_out=tuple(int(c) for c in halo_out),
        max_halo_in=int(halo_in.max()), mean_halo_in=float(halo_in.mean()),
        max_halo_out=int(halo_out.max()), mean_halo_out=float(halo_out.mean()),
        max_rank_halo=int(np.maximum(halo_in, halo_out).max()),
        nodes=tuple(int(c) for c in sizes), edges=tuple(int(c) for c in edges),
        train_nodes=tuple(int(c) for c in train), node_balance=_balance(torch.from_numpy(sizes)),
        edge_balance=_balance(torch.from_numpy(edges)), train_balance=_balance(torch.from_numpy(train)))
    return report, rank_hashes


def _npy(path: Path, name: str, base: Path) -> np.ndarray:
    try:
        arr = np.load(path, mmap_mode="c", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise PartitionError(f"cannot read {name} in {base}: {str(exc).splitlines()[0]}; {_RERUN}") from None
    if not isinstance(arr, np.ndarray):
        raise PartitionError(f"{name} in {base} is not a .npy array; {_RERUN}")
    return arr


def _tensor(arr: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(arr) if arr.size else torch.from_numpy(np.array(arr))


@one_line_errors
def load_rank_folder(dir: str | Path, rank: int, *, expected_fingerprint: str | None = None,
                     expected_parts: int | None = None) -> LocalPartition:
    """Rank ``rank``'s :class:`LocalPartition` from the version-2 directory ``dir``, reading
    only ``dir/meta.json`` and ``dir/part_{rank}/`` (and, without copied features, the
    graph's ``x.npy`` rows of this rank). Every file's sha256 is checked (streamed)
    before use; arrays stay file-backed memory maps where the contract's dtype allows.
    Raises a one-line :class:`PartitionError` on any problem."""
    meta = load_meta(dir)
    if meta.get("version") != VERSION:
        raise PartitionError(f"{Path(dir) / 'meta.json'} is a version-{meta.get('version')} partition, "
                             f"not one folder per rank; use load_partition")
    return load_partition(dir, rank, expected_fingerprint=expected_fingerprint, expected_parts=expected_parts)


def load_rank(path: Path, rank: int, meta: dict[str, Any]) -> LocalPartition:
    """The part of :func:`load_rank_folder` after ``meta.json`` and the caller's expectations
    were checked (called by :func:`commgnn.partition.store.load_partition`)."""
    name = rank_dir(rank)
    rd = path / name
    mpath = rd / "meta.json"
    try:
        text = mpath.read_bytes()
    except FileNotFoundError:
        raise PartitionError(f"partition dir {path} is missing {name}/meta.json; {_RERUN}") from None
    except OSError as exc:
        raise PartitionError(f"cannot read {mpath}: {exc.strerror}") from None
    if hashlib.sha256(text).hexdigest() != meta["files"][name]:
        raise PartitionError(f"{name}/meta.json in {path} is corrupt (sha256 mismatch); {_RERUN}")
    try:
        rmeta = json.loads(text)
        hashes = rmeta["files"]
        scalars = {k: rmeta[k] for k in ("rank", "num_parts", "num_nodes_global", "num_classes")}
        counts = {k: [int(c) for c in rmeta[k]] for k in ("recv_counts", "send_counts")}
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in scalars.values()):
            raise ValueError("non-integer scalar")
    except (ValueError, KeyError, TypeError) as exc:
        raise PartitionError(f"{name}/meta.json in {path} is malformed ({exc}); {_RERUN}") from None
    x_source = rmeta.get("x_source")
    arrays: dict[str, np.ndarray] = {}
    for n in _ARRAYS:
        if n == "x" and x_source is not None:
            continue
        fname = f"{n}.npy"
        if not isinstance(hashes.get(fname), str):
            raise PartitionError(f"{name}/meta.json in {path} lists no hash for {fname}; {_RERUN}")
        try:
            digest = _sha256(rd / fname)
        except FileNotFoundError:
            raise PartitionError(f"partition dir {path} is missing {name}/{fname}; {_RERUN}") from None
        if digest != hashes[fname]:
            raise PartitionError(f"{name}/{fname} in {path} is corrupt (sha256 mismatch); {_RERUN}")
        arrays[n] = _npy(rd / fname, f"{name}/{fname}", path)
    x = _source_rows(x_source, arrays["global_ids"], path) if x_source is not None else None
    indptr, indices = arrays["indptr"], arrays["indices"]
    n_own = len(arrays["global_ids"])
    n_src = n_own + len(arrays["halo_global_ids"])
    if indptr.shape != (n_own + 1,) or indptr.dtype != np.int64 or indices.ndim != 1 \
            or not np.issubdtype(indices.dtype, np.integer) \
            or (n_own and (indptr[0] != 0 or indptr[-1] != len(indices) or (np.diff(indptr) < 0).any())) \
            or not _within(indices, n_src):
        raise PartitionError(f"{name} in {path} has an inconsistent in-CSR (indptr/indices); {_RERUN}")
    tensors = {n: _tensor(arrays[n]) for n in _ARRAYS if n not in ("indptr", "indices", "x")}
    lp = FolderPartition(**scalars, **counts, csr=(indptr, indices), x=x if x is not None else _tensor(arrays["x"]),
                         **tensors)
    # the in-CSR was checked above, without expanding it; rows read from the graph's x.npy
    # by id are not scanned here (their file's sha256 was checked when it was partitioned)
    problem = check_local_partition(lp, rank=rank, num_parts=meta["num_parts"], num_nodes=meta["num_nodes"],
                                    num_features=meta.get("num_features"), num_classes=meta.get("num_classes"),
                                    edges=False, values=x is None)
    if problem:
        raise PartitionError(f"{name} in {path} is inconsistent: {problem}; {_RERUN}")
    return lp


VERSION_LOADERS[VERSION] = load_rank


def _within(indices: np.ndarray, n: int, chunk: int = 1 << 24) -> bool:
    """Every entry of the (memory-mapped) ``indices`` in ``[0, n)``, read by chunks."""
    return all(int(indices[a:a + chunk].min()) >= 0 and int(indices[a:a + chunk].max()) < n
               for a in range(0, len(indices), chunk))


def _source_rows(src: Any, gids: np.ndarray, path: Path) -> SourceRows:
    """This rank's feature rows, read on use from the graph's ``x.npy`` recorded in
    ``x_source`` (its size, shape and dtype are checked: its sha256 was taken once, at
    partitioning)."""
    try:
        xp = Path(src["path"])
        ok = xp.stat().st_size == src["size"]
        x = np.load(xp, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PartitionError(f"the features of partition dir {path} stay in {src.get('path') if isinstance(src, dict) else src!r}, "
                             f"which cannot be read ({exc}); {_RERUN}") from None
    if not ok or list(x.shape) != src["shape"] or str(x.dtype) != src["dtype"]:
        raise PartitionError(f"{xp} changed since partition dir {path} was made (size, shape or dtype); {_RERUN}")
    if len(gids) and int(gids[-1]) >= x.shape[0]:  # ascending ids: the last is the largest
        raise PartitionError(f"{path} names rows of {xp} beyond its {x.shape[0]} rows; {_RERUN}")
    return SourceRows(x, gids)


def folder_fingerprint(folder: Any) -> str:
    """The graph folder's fingerprint as :func:`commgnn.data.ondisk_check.check_graph_folder`
    computes it (one streamed pass that also validates every file), so that a partition
    made here and a run that checks the folder name the same graph."""
    from commgnn.data.ondisk_check import check_graph_folder

    return check_graph_folder(folder.path).fingerprint


__all__ = ["LAYOUT", "VERSION", "folder_fingerprint", "load_rank_folder", "rank_dir", "write_partition_folders"]
