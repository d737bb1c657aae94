"""A user's own PyG model on its way to the ranks and into the run directory.

Local ranks are spawned processes, so the model travels pickled. ``cloudpickle`` pickles a
class defined in a notebook or a script's ``__main__`` by value (the standard pickle can
only name it, and a spawned rank could not import it); an importable class travels by
reference. The same bytes are kept as ``RUN_DIR/model_module.pkl``, so ``--resume`` and
:func:`commgnn.load_result` can rebuild the user's class around ``model.pt``.
"""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import cloudpickle
from torch import nn

from commgnn.runner.config import RunConfig
from commgnn.errors import ConfigError, UserError
from commgnn.models.byo import DistributedModel

FILE = "model_module.pkl"


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
    return None if module is None else cloudpickle.dumps(module)


def unpack_model(packed: bytes | None) -> nn.Module | None:
    return None if packed is None else pickle.loads(packed)


def write_own_model(out: Path, module: nn.Module) -> None:
    tmp = out / (FILE + ".tmp")
    tmp.write_bytes(cloudpickle.dumps(module))
    tmp.replace(out / FILE)


def read_own_model(out: Path) -> nn.Module | None:
    """The user's model kept in the run directory (None for a built-in model)."""
    path = Path(out) / FILE
    if not path.is_file():
        return None
    try:
        return pickle.loads(path.read_bytes())
    except Exception as exc:  # the class's module cannot be imported here, a torn file, ...
        raise UserError(f"cannot rebuild your model from {path}: {type(exc).__name__}: {exc}") from None
