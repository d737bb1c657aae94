"""A user's own PyG model: checked, carried to the ranks of a live run, and recorded in the
run folder by name, never pickled there.

**A live run.** The launcher hands the module to the ranks it starts through its own pipe
(:func:`pack_model`: ``cloudpickle`` bytes this process has just written, so a class defined
in a notebook or a script's ``__main__`` travels by value). That is not input from anyone
else: nothing of it is read back from the run folder.

**The run folder** holds only JSON and tensors:

* ``own_model.json``: the class's import path (``module`` and ``qualname``), its name, and
  its constructor arguments (``init``) where they can be derived: the module keeps each
  ``__init__`` parameter without a default as an attribute of the same name holding a
  number, string, bool, None or a list of these (``self.hidden = hidden``), and a module
  built from them has the same parameter names and shapes. Otherwise ``init`` is null.
* ``own_model_init.pt``: the state dict training started from (a resume from before the
  first checkpoint starts where the run started).
* ``model.pt``: the trained weights (written by the ranks).

**Rebuilding it** (:func:`load_own_model`, used by :func:`commgnn.load_result`,
:func:`commgnn.predict` and :func:`commgnn.resume`): with ``model=`` an instance of the
recorded class, that instance (a copy) is used; with ``model=`` the class, or with nothing
given, the class is built from the recorded ``init``, imported by name when not given. A
class defined in ``__main__``, in a notebook or inside a function cannot be imported by
name, and one whose constructor arguments were not recorded cannot be built: each is
refused in one line that says to pass ``model=``. The imported object must be an
``nn.Module`` subclass of the recorded name before anything calls it. A folder from an older
commgnn that holds ``model_module.pkl`` is never unpickled: it needs ``model=``.

**What may be imported by name.** Importing a module runs its import-time code, and the
name comes from the folder, so (:func:`import_outside`):

* ``model.pt`` (for ``predict`` and ``load_result``) and ``own_model_init.pt`` are checked
  against their recorded sha256 first; a damaged or swapped file stops the command before
  any import.
* The module is looked up, without running anything, on ``sys.path`` less the current
  directory (``''``, relative entries and the current directory's own path, which
  ``python -m`` and ``python -c`` put there) and less the run folder and anything inside
  it; each package on a dotted path is looked up the same way before it is imported. A
  module whose file or package folder lies inside the run folder, or that is found only in
  the run folder or the current directory, is refused in one line that says to pass
  ``model=``. So a module is imported only from an installed location or a ``sys.path``
  entry that you added yourself (``PYTHONPATH``, a script's own folder when that is not
  the current directory).
* A module this process has already imported (your script's ``from mymodels import Net``)
  is used as it is: nothing runs again, wherever it came from, unless it came from inside
  the run folder.

A folder that names a module installed here can still make commgnn import it, as any
``import`` of that name would; for a stranger's folder, pass ``model=`` (the class is then
never imported by name). Ranks receive the class the launcher holds; they resolve a class
that was imported by name by that name again, so do not run ``python -m commgnn`` from
inside a stranger's folder (it puts that folder first on ``sys.path`` for every import;
the ``commgnn`` command does not).
"""

from __future__ import annotations

import copy
import importlib
import importlib.machinery
import importlib.util
import inspect
import json
import math
import pickle
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import cloudpickle
import torch
from torch import nn

from commgnn.integrity import atomic_write_json, load_run_file, save_run_file
from commgnn.errors import ConfigError, UserError
from commgnn.models.byo import DistributedModel
from commgnn.runner.config import RunConfig

RECORD = "own_model.json"
"""The run folder's record of a user's model class (JSON)."""
START = "own_model_init.pt"
"""The state dict a user's model started training from (tensors only)."""
LEGACY = "model_module.pkl"
"""What older versions pickled into the run folder; never loaded."""

_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def check_own_model(module: nn.Module, cfg: RunConfig) -> None:
    """Refuse, before anything starts, what the user's model cannot do (one line each)."""
    DistributedModel(copy.deepcopy(module))  # unsupported layers and norms raise here
    if cfg.comm.halo.precompute:
        raise ConfigError("comm.halo.precompute is not available with your own model; drop it")
    if cfg.train.mode == "minibatch":
        raise ConfigError("train.mode = 'minibatch' runs the built-in GraphSAGE; your own model trains full-graph")
    if cfg.output.embeddings_layer is not None:
        raise ConfigError("output.embeddings_layer is for the built-in models; with your own model, "
                          "load result.model and run its layers yourself")


def pack_model(module: nn.Module | None) -> bytes | None:
    """The module as the live launcher hands it to its own ranks (never written to disk)."""
    return None if module is None else cloudpickle.dumps(module)


def carry_model(module: nn.Module | None, parts: int) -> bytes | nn.Module | None:
    """What the launcher hands its ranks: :func:`pack_model`'s bytes for spawned ranks, a
    copy of the module for one rank in this process (the caller's module stays untrained)."""
    if module is None:
        return None
    return copy.deepcopy(module) if parts == 1 else pack_model(module)


def unpack_model(packed: bytes | nn.Module | None) -> nn.Module | None:
    """In a rank: the module :func:`carry_model` made in this run's launcher."""
    if packed is None or isinstance(packed, nn.Module):
        return packed
    return pickle.loads(packed)


def describe_own_model(module: nn.Module) -> dict[str, Any]:
    """What ``own_model.json`` records of ``module`` (see the module docstring)."""
    cls = type(module)
    importable = cls.__module__ != "__main__" and "<locals>" not in cls.__qualname__ \
        and bool(_DOTTED.match(cls.__module__)) and bool(_DOTTED.match(cls.__qualname__))
    return {"class": cls.__name__, "module": cls.__module__, "qualname": cls.__qualname__,
            "importable": importable, "init": derive_init(module)}


def derive_init(module: nn.Module) -> dict[str, Any] | None:
    """Constructor arguments of ``module`` read back from its attributes, or None when they
    cannot be (a parameter without a default that is not kept as a plain attribute, ``*args``,
    or a module built from them that differs from ``module`` in parameter names or shapes).
    The global random state is left as it was."""
    cls = type(module)
    try:
        params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    except (TypeError, ValueError):
        return None
    init: dict[str, Any] = {}
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            if p.kind == p.VAR_POSITIONAL:
                return None
            continue
        value = module.__dict__.get(p.name, inspect.Parameter.empty)
        if value is not inspect.Parameter.empty and _plain(value):
            init[p.name] = list(value) if isinstance(value, tuple) else value
        elif p.default is inspect.Parameter.empty:
            return None
    try:
        with torch.random.fork_rng(devices=[]):
            built = cls(**init)
    except Exception:
        return None
    if _shapes(built) != _shapes(module):
        return None
    return init


def write_own_model(out: Path, module: nn.Module, record: dict[str, Any] | None = None) -> None:
    """``own_model.json`` (``record``, default :func:`describe_own_model`) and
    ``own_model_init.pt`` (its sha256 in ``hashes.json``) into the folder ``out``: the run
    folder's staging folder, so that the run folder appears with them (each file is also
    written whole, then renamed into place)."""
    atomic_write_json(out / RECORD, record if record is not None else describe_own_model(module))
    save_run_file({k: v.detach().cpu() for k, v in module.state_dict().items()}, out, START)  # hashed


def recorded_own_model(out: Path) -> dict[str, Any] | None:
    """``own_model.json`` of the run folder ``out``; None for a built-in model. A folder
    that pickled the model (older versions) gives ``{"legacy": True}``."""
    path = Path(out) / RECORD
    if path.is_file():
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise UserError(f"cannot read {path}: {exc}") from None
        if not isinstance(record, dict) or not all(isinstance(record.get(k), str)
                                                   for k in ("class", "module", "qualname")):
            raise UserError(f"{path} is not a record of a model class (module, qualname, class)")
        return record
    if (Path(out) / LEGACY).is_file():
        return {"legacy": True, "class": "your model", "module": "?", "qualname": "?", "init": None}
    return None


def load_own_model(out: Path, model: nn.Module | type | None = None, *,
                   verb: str = "commgnn.load_result(run_dir, model=MODEL)") -> nn.Module | None:
    """The user's model of the run folder ``out``, rebuilt without unpickling anything
    (see the module docstring), with the weights it started training from where they are
    recorded; None for a built-in model. ``verb`` is the call the one-line refusals tell the
    user to make, ``MODEL`` standing for the model argument."""
    record = recorded_own_model(out)
    if record is None:
        if model is not None:
            raise UserError(f"{out} trained a built-in model; model= is for runs of your own model")
        return None
    name = record["class"]
    if record.get("legacy"):
        if not isinstance(model, nn.Module):
            raise UserError(f"{out} holds your model pickled ({LEGACY}, from an older commgnn), which is "
                            f"not loaded because it could run code; pass an instance: "
                            f"{verb.replace('MODEL', 'YourModel(...)')}")
        return copy.deepcopy(model)
    start = Path(out) / START
    # Checked against its sha256 before anything is imported (tensors only, nothing runs).
    started = load_run_file(out, START) if start.is_file() else None
    if isinstance(model, nn.Module):
        _same_class(type(model), record, out)
        module = copy.deepcopy(model)
    else:
        cls = model if isinstance(model, type) else _import_class(record, out, verb)
        _same_class(cls, record, out)
        init = record.get("init")
        if not isinstance(init, dict):
            raise UserError(f"{out} trained your model {name}, whose constructor arguments could not be "
                            f"recorded; pass an instance: {verb.replace('MODEL', f'{name}(...)')}")
        try:
            with torch.random.fork_rng(devices=[]):
                module = cls(**init)
        except Exception as exc:
            raise UserError(f"cannot build {name}(**{init}) recorded in {out / RECORD}: "
                            f"{type(exc).__name__}: {exc}; pass an instance with model=") from None
    if started is not None:
        load_weights(module, started, start)
    return module


def load_weights(module: nn.Module, state: Any, path: Path) -> None:
    """``module.load_state_dict(state)``, refused in one line naming ``path`` when the
    weights do not fit the module (another class, other sizes)."""
    if not isinstance(state, dict):
        raise UserError(f"{path} does not hold a state dict")
    try:
        module.load_state_dict(state)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()
        raise UserError(f"the weights in {path} do not fit {type(module).__name__}: "
                        f"{first[1].strip() if len(first) > 1 else first[0] if first else exc}") from None


def _import_class(record: dict[str, Any], out: Path, verb: str) -> type:
    name, mod, qual = record["class"], record["module"], record["qualname"]
    hint = verb.replace("MODEL", name)
    if not record.get("importable", True) or not _DOTTED.match(mod) or not _DOTTED.match(qual):
        where = "in __main__ (a script or notebook)" if mod == "__main__" else f"in {mod} as {qual}"
        raise UserError(f"{out} trained your model {name}, defined {where}, which cannot be imported by "
                        f"name; pass the class or an instance: {hint}")
    try:
        obj: Any = import_outside(mod, Path(out))
        for part in qual.split("."):
            obj = getattr(obj, part)
    except _Refused as exc:
        raise UserError(f"{out} trained your model {mod}.{qual}; {exc}, so it is not imported (that would run "
                        f"code found there); pass the class or an instance: {hint}") from None
    except Exception as exc:
        raise UserError(f"{out} trained your model {mod}.{qual}, which cannot be imported here "
                        f"({type(exc).__name__}: {exc}); pass the class or an instance: {hint}") from None
    if not (isinstance(obj, type) and issubclass(obj, nn.Module)):
        raise UserError(f"{out / RECORD} names {mod}.{qual}, which is not an nn.Module class; nothing was built")
    return obj


class _Refused(Exception):
    """A module that :func:`import_outside` does not import (the message says where it is)."""


def import_outside(name: str, run_dir: Path) -> ModuleType:
    """Import the module ``name`` (dotted) unless any part of it would come from inside
    ``run_dir`` or from the current directory (see the module docstring for the rule). Each
    package on the way is located first without running anything (``find_spec``) with
    ``sys.path`` stripped of the current directory (``''``, relative entries and the
    current directory's own path) and of ``run_dir`` and anything inside it, and refused
    when its file or package folder lies inside ``run_dir``; the import itself runs with the
    same stripped ``sys.path``. A module already imported by this process is used as it is
    (importing it again runs nothing), unless it was loaded from inside ``run_dir``."""
    run_dir, cwd = Path(run_dir).resolve(), Path.cwd().resolve()

    def inside_run(where: str) -> bool:
        path = Path(where).resolve()
        return path == run_dir or run_dir in path.parents

    def kept(entry: Any) -> bool:
        if not isinstance(entry, str) or not entry or not Path(entry).is_absolute():
            return False  # '' and relative entries are the current directory's
        path = Path(entry).resolve()
        return path != cwd and not (path == run_dir or run_dir in path.parents)

    parts = name.split(".")
    saved = list(sys.path)
    sys.path[:] = [e for e in saved if kept(e)]
    try:
        importlib.invalidate_caches()
        for i in range(1, len(parts) + 1):
            sub = ".".join(parts[:i])
            loaded = sys.modules.get(sub)
            if loaded is not None:
                spec = getattr(loaded, "__spec__", None)
            else:
                spec = importlib.util.find_spec(sub)  # the parent is imported already: nothing runs here
                if spec is None:
                    found = importlib.machinery.PathFinder.find_spec(sub, [str(cwd), str(run_dir)]) \
                        if i == 1 else None
                    if found is not None:
                        raise _Refused(f"{sub} is found only in the run folder or the current directory "
                                       f"({found.origin or sub})")
                    raise ModuleNotFoundError(f"No module named {sub!r}")
            places = [spec.origin] if spec is not None and spec.has_location and spec.origin else []
            places += list(getattr(spec, "submodule_search_locations", None) or [])
            for where in places:
                if inside_run(where):
                    raise _Refused(f"{sub} would come from inside the run folder ({where})")
            if loaded is None:
                importlib.import_module(sub)
        return sys.modules[name]
    finally:
        sys.path[:] = saved


def _same_class(cls: type, record: dict[str, Any], out: Path) -> None:
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise UserError(f"model= takes your nn.Module class or an instance of it, got {cls!r}")
    if cls.__qualname__ != record["qualname"]:
        raise UserError(f"{out} trained {record['class']} ({record['module']}.{record['qualname']}); "
                        f"model= is a {cls.__qualname__}")


def _plain(value: Any) -> bool:
    """A constructor argument JSON keeps as it is."""
    if isinstance(value, float):
        return math.isfinite(value)
    if value is None or isinstance(value, (bool, int, str)):
        return True
    return isinstance(value, (list, tuple)) and all(
        v is None or isinstance(v, (bool, int, str)) or (isinstance(v, float) and math.isfinite(v)) for v in value)


def _shapes(module: nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}
