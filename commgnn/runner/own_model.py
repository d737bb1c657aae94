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
refused in one line that says to pass ``model=``. Importing by name runs that module's
import-time code, as ``import`` in a script would; the imported object must be an
``nn.Module`` subclass of the recorded name before anything calls it. A folder from an older
commgnn that holds ``model_module.pkl`` is never unpickled: it needs ``model=``.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
import math
import pickle
import re
from pathlib import Path
from typing import Any

import cloudpickle
import torch
from torch import nn

from commgnn.integrity import load_run_file, save_run_file
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
    ``own_model_init.pt`` into the run folder ``out`` (each written whole, then renamed
    into place)."""
    text = json.dumps(record if record is not None else describe_own_model(module), indent=2) + "\n"
    tmp = out / (RECORD + ".tmp")
    tmp.write_text(text)
    tmp.replace(out / RECORD)
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
    start = Path(out) / START
    if start.is_file():
        load_weights(module, load_run_file(out, START), start)  # sha256-checked, tensors only
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
        obj: Any = importlib.import_module(mod)
        for part in qual.split("."):
            obj = getattr(obj, part)
    except Exception as exc:
        raise UserError(f"{out} trained your model {mod}.{qual}, which cannot be imported here "
                        f"({type(exc).__name__}: {exc}); pass the class or an instance: {hint}") from None
    if not (isinstance(obj, type) and issubclass(obj, nn.Module)):
        raise UserError(f"{out / RECORD} names {mod}.{qual}, which is not an nn.Module class; nothing was built")
    return obj


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
