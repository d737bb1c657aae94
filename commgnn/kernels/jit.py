"""numba, when it is installed; otherwise decorators that leave plain Python behind.

Callers check :data:`AVAILABLE` (via :func:`commgnn.kernels.available`) and use the torch
path when it is false, so numba stays an optional dependency (``pip install
commgnn[kernels]``). Compiled functions are cached on disk (``cache=True``), so a rank pays
the compilation once per machine, not once per process.
"""

from __future__ import annotations

from typing import Any, Callable

try:
    import numba as _numba
except ImportError:  # pragma: no cover - exercised where numba is absent
    _numba = None

AVAILABLE = _numba is not None
"""Whether numba imported."""


def njit(**options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``numba.njit(**options)``, or the identity without numba."""
    if _numba is None:  # pragma: no cover
        return lambda fn: fn
    return _numba.njit(**options)


prange = _numba.prange if _numba is not None else range


def set_threads(n: int) -> None:
    """Run compiled parallel loops on ``n`` threads (torch's intra-op count, normally)."""
    if _numba is not None:
        _numba.set_num_threads(max(1, min(n, _numba.config.NUMBA_NUM_THREADS)))
