"""Start local ranks from a fork server that imported torch and PyG once.

Spawning a rank imports torch and PyG afresh: about 3 s of CPU each, which on a machine with
fewer cores than ranks dominates the start of a job (the test suite, which starts several
hundred small jobs, takes 302 s from a fork server against 643 s spawned, on 2 cores). multiprocessing's fork server is a clean interpreter,
started (not forked) from the launcher, that imports a preload list once and forks every
rank from there before any thread or process group exists in it. This module (written here,
around the standard library's fork server) closes the gaps between it and spawned ranks:

* **It dies with the launcher, at any moment.** This module is the first of the preload list,
  imported before torch (``commgnn.distributed`` imports nothing heavy), so within a
  fraction of a second of its start the server asks the kernel to SIGKILL it when the
  launcher dies (``PR_SET_PDEATHSIG``). A launcher killed before that call is noticed
  through the server's liveness pipe, whose write end at that moment only the launcher
  holds: end-of-file there ends the server at once, instead of after its imports of torch
  and PyG (seconds on a busy machine). Later the pipe cannot tell: every rank holds a copy
  of its write end. Each rank in turn dies with the server
  (:func:`commgnn.distributed.watchdog.die_with_launcher`); multiprocessing's resource
  tracker ends when the launcher and every rank have closed its pipe.
* **SIGTERM reaches the ranks, not the server.** The server ignores it, so a SIGTERM sent
  to the whole process group (a scheduler cancelling the job) stops the ranks through
  their watchdogs as it would spawned ones, instead of killing them with their server.
* **Ranks write where the launcher writes now**, not where it wrote when the server
  started (a notebook, or pytest's capture, redirects both over time): the launcher's
  stdout and stderr travel with each rank as descriptors (:class:`Stream`).
* **The user's main module stays where it is.** multiprocessing makes the fork server and
  every rank it starts import the launcher's ``__main__`` again (from its file, or by module
  name), so a script without an ``if __name__ == "__main__":`` guard would train again in
  each of them, and a script read from standard input (``python - < script.py``, whose
  ``__file__`` is ``<stdin>``) cannot be found. Ranks need nothing from ``__main__`` (their
  function is ours, and a user's model travels by value), so :func:`main_module_hidden`
  hides it while the server and the ranks start. Scripts, standard input and notebooks
  all launch the same way.
* **Not where it cannot be safe.** CUDA cannot be used in a process forked from one that
  touched it, and some imports do (PyG creates CUDA tensors at import under pytest when
  pyg-lib is installed): with CUDA present ranks are spawned. So are ranks of a process
  that is itself a fork of a launcher (the server belongs to the launcher), ranks started
  off the main thread, and ranks on systems without ``fork``.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import sys
import threading
import types
from multiprocessing import reduction
from typing import Any, Iterator

PRELOAD = (__name__, "torch", "torch.distributed", "torch_geometric")
"""What the server imports once: this module first (it guards the server before the slow
imports), then torch and PyG."""

_owner: int | None = None
"""Pid of the process whose fork server this module set up (a fork of it gets another pid)."""


def start_context(*, cuda: bool) -> Any:
    """The multiprocessing context that starts this launch's ranks (see the module docstring):
    the fork server on Linux, ``spawn`` with ``cuda`` or elsewhere.

    Also ``spawn`` off the main thread: the kernel kills the server when the *thread* that
    started it ends (``PR_SET_PDEATHSIG`` follows threads), which would take the ranks of a
    later launch with it. And ``spawn`` where a fork server this module did not set up runs
    (it has no guard)."""
    global _owner
    from multiprocessing import forkserver

    foreign = _owner is None and getattr(forkserver._forkserver, "_forkserver_pid", None) is not None
    if (cuda or not sys.platform.startswith("linux") or _owner not in (None, os.getpid()) or foreign
            or threading.current_thread() is not threading.main_thread()):
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))  # read when the server starts: once per process
    _owner = os.getpid()
    return ctx


def prestart(*, cuda: bool) -> None:
    """Start the fork server now, where it will be used, so that its imports overlap with
    the launcher's own work (loading and partitioning the graph) instead of following it."""
    ctx = start_context(cuda=cuda)
    if ctx.get_start_method() == "forkserver":
        from multiprocessing import forkserver

        with main_module_hidden():
            forkserver.ensure_running()


_hide_lock = threading.Lock()


@contextlib.contextmanager
def main_module_hidden() -> Iterator[None]:
    """While it is open, ``sys.modules["__main__"]`` is an empty module, so a fork server
    or process started meanwhile neither imports the launcher's main module again nor looks
    for its file (what multiprocessing's preparation data would ask it to do). Code running
    in the launcher is unaffected: its functions keep their own globals. Used only around
    starting processes; the real main module is back when it closes, whatever happened."""
    with _hide_lock:
        real = sys.modules.get("__main__")
        bare = types.ModuleType("__main__")
        sys.modules["__main__"] = bare
        try:
            yield
        finally:
            if sys.modules.get("__main__") is bare:
                if real is None:
                    del sys.modules["__main__"]
                else:
                    sys.modules["__main__"] = real


def in_forked_rank() -> None:
    """First thing in a rank: undo what it inherited from the server and no spawned rank has
    (SIGTERM ignored; the server's liveness pipe, which would keep a dead launcher's server
    waiting for end-of-file)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    from multiprocessing import forkserver

    fd = getattr(forkserver._forkserver, "_forkserver_alive_fd", None)
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass
        forkserver._forkserver._forkserver_alive_fd = None


class Stream:
    """One of the launcher's standard streams (by descriptor), pickled into a rank so that it
    writes where the launcher writes at this launch."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @staticmethod
    def pair(ctx: Any) -> tuple["Stream", "Stream"] | None:
        """stdout and stderr for a forked rank (a spawned one inherits them); None if either
        is closed here (the rank then keeps the server's)."""
        if ctx.get_start_method() != "forkserver":
            return None
        try:
            os.fstat(1), os.fstat(2)
        except OSError:
            return None
        return Stream(1), Stream(2)

    def __reduce__(self) -> tuple[Any, tuple[Any, int]]:
        # DupFd works only while multiprocessing pickles a process for starting: it hands the
        # descriptor over with the process (by SCM_RIGHTS to the fork server).
        return _attach, (reduction.DupFd(self.fd), self.fd)


def _attach(dup: Any, target: int) -> int:
    """In the rank: put the received descriptor at ``target`` (1 or 2)."""
    fd = dup.detach()
    if fd != target:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        os.dup2(fd, target)
        os.close(fd)
    return target


_server_pid: int | None = None


def _on_sigterm(signum: int, frame: Any) -> None:
    """The server's SIGTERM handler: the server itself ignores SIGTERM (its launcher and
    ranks handle theirs); a process forked from it that has not yet set its own handling
    (a rank starting) dies of it as it would without this handler."""
    if os.getpid() == _server_pid:
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _guard_server(alive_r: int | None) -> None:
    """In our fork server, before it imports torch: die with the launcher, and leave
    SIGTERM to the ranks. ``alive_r``: the read end of the server's liveness pipe."""
    global _server_pid
    import ctypes
    import select

    _server_pid = os.getpid()
    try:
        # The launcher's main thread started the server (start_context ensures it), and the
        # kernel sends the signal when that thread ends: when the launcher does.
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    # The launcher may have died before the call above. No rank exists yet, so only the
    # launcher holds the pipe's write end, and the pipe is readable exactly when it is gone.
    if alive_r is not None:
        try:
            dead = bool(select.select([alive_r], [], [], 0)[0])
        except (OSError, ValueError):
            dead = False
        if dead:
            os._exit(0)
    signal.signal(signal.SIGTERM, _on_sigterm)


_PR_SET_PDEATHSIG = 1


def _our_fork_server() -> dict[str, Any] | None:
    """The locals of ``multiprocessing.forkserver.main`` while it imports the preload list
    that :func:`start_context` set; None elsewhere (another fork server may import this
    module too, through its ``__main__``: it is left alone)."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "main" and code.co_filename.endswith(os.path.join("multiprocessing", "forkserver.py")):
            local = frame.f_locals
            return dict(local) if list(local.get("preload") or ()) == list(PRELOAD) else None
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _guard_if_our_server() -> None:
    server = _our_fork_server()
    if server is not None:
        alive_r = server.get("alive_r")
        _guard_server(alive_r if isinstance(alive_r, int) else None)


_guard_if_our_server()
