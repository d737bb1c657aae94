"""numba, when it is installed; otherwise decorators that leave plain Python behind.

Callers check :data:`AVAILABLE` (via :func:`commgnn.kernels.available`) and use the torch
path when it is false, so numba stays an optional dependency (``pip install
commgnn[kernels]``). Compiled functions are cached on disk (``cache=True``), so a rank pays
the compilation once per machine, not once per process.

Row-parallel kernels are compiled twice (:func:`parallel_njit`): with ``prange`` over
numba's thread pool, and as a plain serial loop for one thread. A rank given one thread
(8 ranks on 2 cores) runs the serial one, so numba's OpenMP pool never starts: its workers
spin-wait between parallel regions (libgomp's default wait policy) and take CPU from the
ranks' main threads on a shared machine. Each output row is computed by one thread in the
same order either way, so both give the same bits.
"""

from __future__ import annotations

import types
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

_threads: int | None = None
"""The thread count :func:`set_threads` last set (None: numba's own default); 1 runs the
serial compilations."""


class _TwoWay:
    """A kernel compiled row-parallel and serial; a call runs the one the thread count asks for."""

    def __init__(self, fn: Callable[..., Any], options: dict[str, Any]) -> None:
        assert _numba is not None
        self.parallel = _numba.njit(parallel=True, **options)(fn)
        # A distinct function object with its own qualified name: numba's on-disk cache is
        # keyed by the function's name and line, not by `parallel`, so the two would share it.
        serial = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__ + "_serial", fn.__defaults__,
                                    fn.__closure__)
        serial.__qualname__ = fn.__qualname__ + "_serial"
        self.serial = _numba.njit(parallel=False, **options)(serial)
        self.__doc__, self.__name__ = fn.__doc__, fn.__name__

    def __call__(self, *args: Any) -> Any:
        return (self.serial if _threads == 1 else self.parallel)(*args)


def parallel_njit(**options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``numba.njit(parallel=True, **options)`` plus a serial compilation for one thread
    (see the module docstring); the identity without numba."""
    if _numba is None:  # pragma: no cover
        return lambda fn: fn
    return lambda fn: _TwoWay(fn, options)


def set_threads(n: int) -> None:
    """Run compiled parallel loops on ``n`` threads (torch's intra-op count, normally); at
    ``n = 1`` the serial compilations run and numba's thread pool stays unstarted."""
    global _threads
    _threads = max(1, n)
    if _numba is not None and _threads > 1:
        _numba.set_num_threads(min(_threads, _numba.config.NUMBA_NUM_THREADS))
