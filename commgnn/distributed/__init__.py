"""Runtime leaf: process groups, launch, and the communication event bus.

The names below are imported on first use: the fork server imports
:mod:`commgnn.distributed.forkserver` before torch, so that it guards itself (dies with its
launcher) from its first moments, and importing this package must not import torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_EXPORTS = {"DistContext": "context", "LaunchInfo": "context", "RuntimeConfig": "config",
            "init_distributed": "context", "launch_info_from_env": "context", "shutdown": "context",
            "CommEvent": "events", "Hooks": "events", "TimeEvent": "events"}

__all__ = list(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from commgnn.distributed.config import RuntimeConfig
    from commgnn.distributed.context import DistContext, LaunchInfo, init_distributed, launch_info_from_env, shutdown
    from commgnn.distributed.events import CommEvent, Hooks, TimeEvent


def __getattr__(name: str) -> object:
    """The package's names, imported from their modules on first use."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'commgnn.distributed' has no attribute {name!r}")
    return getattr(importlib.import_module(f"commgnn.distributed.{_EXPORTS[name]}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
