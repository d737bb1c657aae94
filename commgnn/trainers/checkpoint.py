"""Atomic checkpoints of a partition-parallel run, and the newest complete one.

Layout inside the run directory::

    checkpoints/epoch-000050/rank0.pt ... rank{P-1}.pt
    checkpoints/latest.json      {"epoch": 50, "parts": P, "dir": "epoch-000050", "fingerprint": ...}

Every rank writes its own state (:meth:`FullGraphTrainer.state_dict`, which holds the
model, optimiser, scheduler, RNG and every stateful communication part, plus the meter's
byte totals) to a temporary name and renames it into place. Only after all ranks have
written (the caller puts a barrier between :func:`save_rank` and :func:`commit`) does rank 0
replace ``latest.json``, so it never names an incomplete set; then older sets are removed.
A crash at any moment leaves the previous complete set usable.

On a shared file system this works across machines too; without one, each host needs the
run directory at the same path (as ``torchrun`` users already arrange for their data).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from commgnn.errors import UserError

DIR = "checkpoints"


def _set_dir(run_dir: Path, epoch: int) -> Path:
    return Path(run_dir) / DIR / f"epoch-{epoch:06d}"


def save_rank(run_dir: Path, epoch: int, rank: int, state: dict[str, Any]) -> None:
    """Write this rank's ``state`` for ``epoch`` atomically (temporary file, then rename)."""
    d = _set_dir(run_dir, epoch)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".rank{rank}.pt.tmp"
    torch.save(state, tmp)
    os.replace(tmp, d / f"rank{rank}.pt")


def commit(run_dir: Path, epoch: int, parts: int, fingerprint: str) -> None:
    """Rank 0, after every rank saved ``epoch``: point ``latest.json`` at it, drop older sets."""
    root = Path(run_dir) / DIR
    meta = {"epoch": epoch, "parts": parts, "dir": _set_dir(run_dir, epoch).name, "fingerprint": fingerprint}
    tmp = root / ".latest.json.tmp"
    tmp.write_text(json.dumps(meta) + "\n")
    os.replace(tmp, root / "latest.json")
    for old in root.glob("epoch-*"):
        if old.name != meta["dir"]:
            shutil.rmtree(old, ignore_errors=True)


def latest(run_dir: Path) -> dict[str, Any] | None:
    """The newest complete checkpoint's record, or None when the run has none."""
    path = Path(run_dir) / DIR / "latest.json"
    if not path.is_file():
        return None
    try:
        meta = json.loads(path.read_text())
        return {"epoch": int(meta["epoch"]), "parts": int(meta["parts"]), "dir": str(meta["dir"]),
                "fingerprint": str(meta["fingerprint"])}
    except (ValueError, KeyError, TypeError):
        raise UserError(f"checkpoint record {path} is corrupt") from None


def load_rank(run_dir: Path, meta: dict[str, Any], rank: int, *, parts: int, fingerprint: str) -> dict[str, Any]:
    """This rank's state from the checkpoint ``meta`` (from :func:`latest`), checked against
    the job: the same number of ranks and the same graph."""
    if meta["parts"] != parts:
        raise UserError(f"the checkpoint in {run_dir} was written by {meta['parts']} ranks, this job has {parts}")
    if meta["fingerprint"] != fingerprint:
        raise UserError(f"the checkpoint in {run_dir} belongs to another graph (fingerprint "
                        f"{meta['fingerprint']}, this graph {fingerprint})")
    path = Path(run_dir) / DIR / meta["dir"] / f"rank{rank}.pt"
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except FileNotFoundError:
        raise UserError(f"checkpoint file {path} is missing") from None
    except Exception as exc:  # truncated zip, unpickling error, ...
        raise UserError(f"checkpoint file {path} is corrupt ({type(exc).__name__})") from None
    if not isinstance(state, dict) or state.get("epoch") != meta["epoch"]:
        raise UserError(f"checkpoint file {path} does not hold epoch {meta['epoch']}")
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
