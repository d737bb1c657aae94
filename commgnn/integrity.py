"""Files a run writes and later reads again: atomic, hashed, and loaded without running code
(a shared leaf: every layer may use it; it imports only :mod:`commgnn.errors`).

A run folder or a checkpoint may come from a stranger, so every file read back is treated as
untrusted input:

* **Tensors and plain data only.** :func:`load_tensors` unpickles with
  ``torch.load(..., weights_only=True)``: tensors, dicts, lists, tuples, sets, numbers,
  strings, ``None``, dtypes and devices. A pickle that needs any other class (the way a
  malicious file runs a command) is refused before anything of it runs.
* **Hashed.** The writer records each file's SHA-256 in a small JSON manifest, written last
  and atomically (temporary file, ``fsync``, rename, ``fsync`` of the folder), so the
  manifest never names a file that is not wholly on disk. The reader hashes the bytes it
  read and compares before unpickling them (the same bytes: nothing can change the file
  between the check and the load).
* **One line.** A missing, truncated, altered or foreign file raises
  :class:`~commgnn.errors.IntegrityError` (exit 2) naming the file; nothing is loaded.

A run folder's manifest is ``hashes.json`` (``{"files": {"model.pt": "<sha256 hex>", ...}}``);
checkpoints record their hashes in ``checkpoints/latest.json``
(:mod:`commgnn.trainers.checkpoint`), partition folders in ``meta.json``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

from commgnn.errors import IntegrityError

HASHES = "hashes.json"
"""The run folder's manifest of SHA-256 hashes of the tensor files it holds."""


def sha256_bytes(blob: bytes) -> str:
    """The SHA-256 of ``blob``, as 64 lower-case hex digits."""
    return hashlib.sha256(blob).hexdigest()


def sha256_file(path: str | Path) -> str:
    """The SHA-256 of the file at ``path`` (read in blocks), as 64 lower-case hex digits."""
    h = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # a platform without directory descriptors: the rename is all there is
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | Path, blob: bytes) -> None:
    """Write ``blob`` to ``path`` so that a reader sees the old file or all of the new one:
    a temporary sibling, ``fsync``, rename over ``path``, ``fsync`` of the folder (so the
    rename itself is durable before anything that names the file is written)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as fh:
            fh.write(blob)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def replace_dir(tmp: str | Path, dest: str | Path) -> Path:
    """Put the complete folder ``tmp`` at ``dest`` (a sibling): renamed into place, or, when
    ``dest`` exists, swapped with it. There is no atomic directory swap in the standard
    library, so the old folder is first moved aside into a hidden sibling, the new one
    renamed into place, then the old one deleted: a reader sees the old or the new folder,
    never a mix of both."""
    tmp, dest = Path(tmp), Path(dest)
    if not dest.exists():
        os.rename(tmp, dest)
        return dest
    old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
    os.rename(dest, old / dest.name)
    os.rename(tmp, dest)
    shutil.rmtree(old, ignore_errors=True)
    return dest


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """:func:`atomic_write_bytes` of ``obj`` as standard JSON (no NaN or infinity)."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, allow_nan=False) + "\n").encode())


def tensor_bytes(obj: Any) -> bytes:
    """``torch.save`` of ``obj`` into memory (what :func:`save_tensors` writes)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def save_tensors(obj: Any, path: str | Path) -> str:
    """Write ``obj`` (tensors and plain data) to ``path`` atomically; its SHA-256."""
    blob = tensor_bytes(obj)
    atomic_write_bytes(path, blob)
    return sha256_bytes(blob)


def read_verified(path: str | Path, expected_sha: str | None, *, what: str = "file") -> bytes:
    """The bytes of ``path`` once their SHA-256 equals ``expected_sha``; a missing or
    unreadable file, a hash that does not match (altered or truncated) or no recorded hash
    (``None``: the file cannot be verified) raises :class:`IntegrityError` naming it."""
    path = Path(path)
    if expected_sha is None:
        raise IntegrityError(f"{what} {path} has no recorded sha256; it cannot be verified and is not loaded")
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        raise IntegrityError(f"{what} {path} is missing") from None
    except OSError as exc:
        raise IntegrityError(f"cannot read {what} {path}: {exc.strerror}") from None
    if sha256_bytes(blob) != expected_sha:
        raise IntegrityError(f"{what} {path} is corrupt (sha256 mismatch: altered or truncated); it is not loaded")
    return blob


def verify_file(path: str | Path, expected_sha: str | None, *, what: str = "file") -> None:
    """Raise :class:`IntegrityError` unless ``path`` exists with SHA-256 ``expected_sha``."""
    read_verified(path, expected_sha, what=what)


def load_tensors(blob: bytes, path: str | Path, *, what: str = "file") -> Any:
    """Unpickle ``blob`` (read from ``path``) with ``weights_only=True``: tensors and plain
    data only, never code. Anything else raises :class:`IntegrityError` in one line."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for unreadable or foreign files
        text = str(exc)
        if "Weights only load failed" in text or "WeightsUnpickler" in text:
            raise IntegrityError(f"{what} {path} holds more than tensors and plain data (loading it would "
                                 f"run code); refused") from None
        raise IntegrityError(f"{what} {path} is not a readable tensor file ({type(exc).__name__})") from None


def load_verified(path: str | Path, expected_sha: str | None, *, what: str = "file") -> Any:
    """:func:`read_verified`, then :func:`load_tensors` of the same bytes."""
    return load_tensors(read_verified(path, expected_sha, what=what), path, what=what)


def recorded_hashes(run_dir: str | Path) -> dict[str, str]:
    """``{file name: sha256}`` from the run folder's ``hashes.json``; ``{}`` when absent. A
    malformed manifest raises :class:`IntegrityError`."""
    path = Path(run_dir) / HASHES
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, UnicodeDecodeError):
        raise IntegrityError(f"{path} is corrupt (not JSON)") from None
    files = raw.get("files") if isinstance(raw, dict) else None
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise IntegrityError(f"{path} is corrupt (no 'files' table of names and hashes)")
    return dict(files)


def save_run_file(obj: Any, run_dir: str | Path, name: str) -> str:
    """Write ``obj`` to ``run_dir/name`` atomically, then record its hash in ``hashes.json``
    (rewritten atomically, last); the hash. For one writer (rank 0) at a time."""
    run_dir = Path(run_dir)
    sha = save_tensors(obj, run_dir / name)
    try:
        files = recorded_hashes(run_dir)
    except IntegrityError:  # a damaged manifest of an earlier attempt: this run's entries replace it
        files = {}
    files[name] = sha
    atomic_write_json(run_dir / HASHES, {"algorithm": "sha256", "files": files})
    return sha


def load_run_file(run_dir: str | Path, name: str) -> Any:
    """``run_dir/name`` (``model.pt``, ``predictions.pt``, ``embeddings.pt``) checked against
    ``hashes.json`` and loaded as tensors and plain data only; :class:`IntegrityError` (one
    line naming the file) when it is missing, altered, truncated, unrecorded or foreign."""
    run_dir = Path(run_dir)
    return load_verified(run_dir / name, recorded_hashes(run_dir).get(name), what="run file")
