"""Writable copies of read-only dataset folders, safe against crashes and concurrent ranks.

PyG writes ``processed/`` next to ``raw/``, but the shared data root is read-only by
policy (and CI runs as root, which ignores write bits, so "is it writable?" is the wrong
question): every dataset folder is therefore copied into the cache before PyG sees it.

* A copy is built in a temporary sibling folder and renamed into place only after a
  marker file was written into it, so a killed copy is never mistaken for a complete one.
* The marker records the source's file list with sizes and modification times; if the
  source changes, the stale copy (and PyG's processed files in it) is rebuilt.
* Copies are plain files in folders created with default permissions: copying the
  source's read-only modes would stop PyG from writing ``processed/`` (for non-root users)
  and stop the cache from being cleaned.
* An exclusive ``fcntl`` lock per dataset serialises copying and PyG's processing when
  several processes (e.g. the ranks of one job) load the same dataset at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Iterator

from commgnn.errors import DataError

MARKER = ".commgnn-copy.json"
"""File written into a copy once it is complete."""


def root_key(root: Path) -> str:
    """12 hex digits of the SHA-1 of the resolved data root: one cache folder per root."""
    return hashlib.sha1(str(root.resolve()).encode()).hexdigest()[:12]


def source_listing(src: Path) -> list[list[str | int]]:
    """``[relative path, size, mtime_ns]`` of every file under ``src``, sorted."""
    out: list[list[str | int]] = []
    for dirpath, _dirnames, filenames in os.walk(src):
        for fname in filenames:
            path = Path(dirpath) / fname
            st = path.stat()
            out.append([path.relative_to(src).as_posix(), st.st_size, st.st_mtime_ns])
    return sorted(out)


@contextlib.contextmanager
def locked(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path`` (created if needed) for the block."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no cross-process lock, copies stay crash-safe
        yield
        return
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def ensure_copy(src: Path, dest: Path, sub: str) -> Path:
    """Make ``dest/sub`` a complete copy of folder ``src`` and return ``dest``.

    An existing copy is reused when its marker matches ``src``'s current file listing;
    otherwise ``dest`` is rebuilt from scratch. Call it under :func:`locked`.
    """
    listing = source_listing(src)
    marker = {"source": str(src), "files": listing}
    if dest.exists():
        if _read_marker(dest) == marker:
            return dest
        shutil.rmtree(dest)  # incomplete, foreign or stale: start over
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        target = tmp / sub if sub else tmp
        target.mkdir(parents=True)
        for rel, _size, _mtime in listing:
            out = target / str(rel)
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / str(rel), out)
        (tmp / MARKER).write_text(json.dumps(marker))
        os.rename(tmp, dest)
    except OSError as exc:
        raise DataError(f"could not copy {src} into the cache at {dest}: {exc.strerror or exc} "
                        f"(set data.cache_dir to a writable folder with free space)") from exc
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _read_marker(dest: Path) -> object:
    try:
        return json.loads((dest / MARKER).read_text())
    except (OSError, ValueError):
        return None
