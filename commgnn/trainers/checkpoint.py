"""Atomic, hashed checkpoints of a partition-parallel run, and the newest complete one.

Layout inside the run directory::

    checkpoints/epoch-000050/rank0.pt ... rank{P-1}.pt
    checkpoints/latest.json      {"epoch": 50, "parts": P, "dir": "epoch-000050", "fingerprint": ...,
                                  "sha256": {"rank0.pt": "<hex>", ...}}

Every rank writes its own state (:meth:`FullGraphTrainer.state_dict`, which holds the
model, optimiser, scheduler, RNG and every stateful communication part, plus the meter's
byte totals; :func:`save_rank` adds the process's Python and NumPy RNG states) to a
temporary name, ``fsync``-s it and renames it into place, and returns its SHA-256. Only
after all ranks have written (the caller gathers the hashes, which is also the barrier,
between :func:`save_rank` and :func:`commit`) does rank 0 replace ``latest.json``, the set's
manifest, atomically and last, so it never names an incomplete set; then older sets are
removed. A crash at any moment leaves the previous complete set usable.

A checkpoint may come from a stranger. It holds tensors and plain data only (NumPy arrays
are stored as tensors under a tag and turned back on load, :func:`to_plain`), it is
unpickled with ``weights_only=True``, and :func:`load_rank` compares its bytes with the
hash in ``latest.json`` before unpickling them: a missing, truncated, altered or foreign
file, or a record without hashes, is refused in one line naming the file
(:class:`~commgnn.errors.IntegrityError`) and nothing of it is loaded.

On a shared file system this works across machines too; without one, each host needs the
run directory at the same path (as ``torchrun`` users already arrange for their data).
"""

from __future__ import annotations

import json
import random
from collections import OrderedDict
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np
import torch

from commgnn.errors import IntegrityError, UserError
from commgnn.integrity import atomic_write_json, load_verified, read_verified, save_tensors

if TYPE_CHECKING:
    from commgnn.distributed.context import DistContext

DIR = "checkpoints"
_NUMPY_TAG = "__commgnn_ndarray__"
_HOST_RNG = "host_rng"
_HEX = frozenset("0123456789abcdef")
# What weights_only=True unpickles as it is; everything else must be converted by to_plain.
_ATOMS = (bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device, torch.Size)


def _set_dir(run_dir: Path, epoch: int) -> Path:
    return Path(run_dir) / DIR / f"epoch-{epoch:06d}"


def to_plain(obj: Any, where: str = "state") -> Any:
    """``obj`` with nothing but what ``torch.load(weights_only=True)`` reads: tensors, the
    atoms above, dicts, lists, tuples and sets of them. NumPy arrays and scalars become
    ``{_NUMPY_TAG: tensor}`` (:func:`from_plain` turns them back). Anything else raises a
    ``TypeError`` naming where it is, at save time, rather than making a checkpoint that
    could not be loaded without running code."""
    if isinstance(obj, (np.ndarray, np.generic)):  # before the atoms: np.float64 is a float
        arr = np.asarray(obj)
        if arr.dtype == object:
            raise TypeError(f"{where}: a NumPy array of Python objects cannot go into a checkpoint")
        tagged = {_NUMPY_TAG: torch.from_numpy(arr.copy())}
        return tagged | {"scalar": True} if isinstance(obj, np.generic) else tagged
    if isinstance(obj, torch.Tensor) or type(obj) in _ATOMS:  # exact: a subclass would be pickled by class
        return obj
    if isinstance(obj, dict):
        items = ((_plain_key(k, where), to_plain(v, f"{where}[{k!r}]")) for k, v in obj.items())
        return OrderedDict(items) if isinstance(obj, OrderedDict) else dict(items)
    if type(obj) in (list, tuple, set):  # not a named tuple: its class would be pickled
        return type(obj)(to_plain(v, f"{where}[{i}]") for i, v in enumerate(obj))
    raise TypeError(f"{where}: a {type(obj).__qualname__} cannot go into a checkpoint (tensors and plain data only)")


def _plain_key(key: Any, where: str) -> Any:
    """A dict key as plain data: a NumPy scalar as the equal Python number (same hash)."""
    if isinstance(key, np.generic):
        return key.item()
    if type(key) in _ATOMS or (type(key) is tuple and all(type(k) in _ATOMS for k in key)):
        return key
    raise TypeError(f"{where}: a key of type {type(key).__qualname__} cannot go into a checkpoint")


def from_plain(obj: Any) -> Any:
    """The inverse of :func:`to_plain`: tagged NumPy arrays back to arrays."""
    if isinstance(obj, dict):
        if _NUMPY_TAG in obj and isinstance(obj[_NUMPY_TAG], torch.Tensor):
            arr = obj[_NUMPY_TAG].numpy()
            return arr[()] if obj.get("scalar") else arr
        return type(obj)((k, from_plain(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple, set)):
        return type(obj)(from_plain(v) for v in obj)
    return obj


def _host_rng_state() -> dict[str, Any]:
    """The process's Python and NumPy global RNG states, as plain data."""
    version, internal, gauss = random.getstate()
    return {"python": [version, list(internal), gauss], "numpy": to_plain(np.random.get_state())}


def _set_host_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np.random.set_state(from_plain(state["numpy"]))


def save_rank(run_dir: Path, epoch: int, rank: int, state: dict[str, Any]) -> str:
    """Write this rank's ``state`` for ``epoch`` atomically (temporary file, ``fsync``,
    rename), with the process's Python and NumPy RNG states; the file's SHA-256, for
    :func:`commit`. A part of ``state`` that is not tensors and plain data raises
    ``TypeError`` here (:func:`to_plain`)."""
    d = _set_dir(run_dir, epoch)
    d.mkdir(parents=True, exist_ok=True)
    return save_tensors(to_plain({**state, _HOST_RNG: _host_rng_state()}), d / f"rank{rank}.pt")


def commit(run_dir: Path, epoch: int, parts: int, fingerprint: str, hashes: list[str]) -> None:
    """Rank 0, after every rank saved ``epoch`` (``hashes``: each rank's :func:`save_rank`
    result, in rank order): write the set's manifest ``latest.json`` atomically, then drop
    older sets."""
    root = Path(run_dir) / DIR
    if len(hashes) != parts:
        raise ValueError(f"{len(hashes)} checkpoint hashes for {parts} ranks")
    meta = {"epoch": epoch, "parts": parts, "dir": _set_dir(run_dir, epoch).name, "fingerprint": fingerprint,
            "sha256": {f"rank{r}.pt": h for r, h in enumerate(hashes)}}
    atomic_write_json(root / "latest.json", meta)
    for old in root.glob("epoch-*"):
        if old.name != meta["dir"]:
            shutil.rmtree(old, ignore_errors=True)


def latest(run_dir: Path) -> dict[str, Any] | None:
    """The newest complete checkpoint's record, or None when the run has none. A record
    that is not plain JSON of the expected shape (a foreign or altered ``latest.json``,
    one from before checkpoints were hashed) raises :class:`IntegrityError`."""
    path = Path(run_dir) / DIR / "latest.json"
    if not path.is_file():
        return None
    try:
        meta = json.loads(path.read_text())
        out = {"epoch": int(meta["epoch"]), "parts": int(meta["parts"]), "dir": str(meta["dir"]),
               "fingerprint": str(meta["fingerprint"])}
        hashes = meta.get("sha256")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, OSError):
        raise IntegrityError(f"checkpoint record {path} is corrupt") from None
    if out["dir"] != f"epoch-{out['epoch']:06d}":  # a name from the record must not leave checkpoints/
        raise IntegrityError(f"checkpoint record {path} is corrupt (names {out['dir']!r})")
    if not isinstance(hashes, dict) or not all(
            isinstance(v, str) and len(v) == 64 and set(v) <= _HEX for v in hashes.values()):
        raise IntegrityError(f"checkpoint record {path} has no sha256 of its files (written by an older "
                             f"commgnn, or altered); it cannot be verified and is not loaded")
    out["sha256"] = dict(hashes)
    return out


def verify(run_dir: Path, parts: int, ranks: Iterable[int] | None = None) -> None:
    """Check the newest checkpoint of ``run_dir`` (if any) before any rank starts: its
    record, and the files of ``ranks`` (default every rank: the local launcher, which sees
    every rank's file; a torchrun rank checks its own) against their recorded SHA-256.
    Raises :class:`IntegrityError` naming the first bad file; the ranks check their own
    file again as they load it."""
    meta = latest(run_dir)
    if meta is None or meta["parts"] != parts:
        return  # none to resume from, or load_rank's one line about the rank count
    for r in range(parts) if ranks is None else ranks:
        name = f"rank{r}.pt"
        read_verified(Path(run_dir) / DIR / meta["dir"] / name, meta["sha256"].get(name), what="checkpoint file")


def gather_hashes(ctx: DistContext, sha: str) -> list[str]:
    """Every rank's :func:`save_rank` hash, in rank order (a collective: every rank calls it,
    so it also confirms that all of them saved)."""
    rows = ctx.all_gather(torch.tensor(list(bytes.fromhex(sha)), dtype=torch.uint8))
    return [bytes(row.tolist()).hex() for row in rows]


def load_rank(run_dir: Path, meta: dict[str, Any], rank: int, *, parts: int, fingerprint: str,
              step_key: str = "epoch") -> dict[str, Any]:
    """This rank's state from the checkpoint ``meta`` (from :func:`latest`), checked against
    the job (the same number of ranks, the same graph) and against its recorded SHA-256
    before it is unpickled (tensors and plain data only). Restores the process's Python and
    NumPy RNG states saved with it."""
    if meta["parts"] != parts:
        raise UserError(f"the checkpoint in {run_dir} was written by {meta['parts']} ranks, this job has {parts}")
    if meta["fingerprint"] != fingerprint:
        raise UserError(f"the checkpoint in {run_dir} belongs to another graph (fingerprint "
                        f"{meta['fingerprint']}, this graph {fingerprint})")
    name = f"rank{rank}.pt"
    path = Path(run_dir) / DIR / meta["dir"] / name
    state = from_plain(load_verified(path, meta["sha256"].get(name), what="checkpoint file"))
    if not isinstance(state, dict) or state.get(step_key) != meta["epoch"]:
        raise IntegrityError(f"checkpoint file {path} does not hold {step_key} {meta['epoch']}")
    host = state.pop(_HOST_RNG, None)
    if host is not None:
        try:
            _set_host_rng_state(host)
        except (TypeError, ValueError, KeyError, IndexError):
            raise IntegrityError(f"checkpoint file {path} holds a malformed RNG state") from None
    return state


GENERATOR_KEY = "gen"
"""Where the communication parts keep a ``torch.Generator``'s state in their state dicts."""


def state_to_device(state: Any, device: torch.device) -> Any:
    """``state`` (nested dicts, lists and tuples of tensors) with its tensors on ``device``.

    Checkpoints load onto the CPU (:func:`load_rank`), but a run on a GPU keeps the levers'
    state (stale rows, gradient-tracking vectors, PowerSGD's memories) where the tensors it
    meets live. Generator states (values under :data:`GENERATOR_KEY`) stay on the CPU:
    ``Generator.set_state`` of the CPU generators the levers draw from takes a CPU byte
    tensor. Levers that work on the host (the gradient compressors' error-feedback
    residuals, the adaptive-bits solver's statistics) copy their state back to the CPU in
    their own ``load_state_dict``: where a lever's state lives is the lever's to know."""
    if isinstance(state, torch.Tensor):
        return state.to(device)
    if isinstance(state, dict):
        return {k: v if k == GENERATOR_KEY else state_to_device(v, device) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(state_to_device(v, device) for v in state)
    return state
