"""Out-of-band failure handling for one rank: heartbeat, abort flag, parent watch, SIGTERM.

Collectives block inside C++ (gloo, NCCL) and cannot be interrupted from Python, and a
peer that died or stopped is only noticed there at the collective time-out. So every rank
of a multi-rank job runs a :class:`Watchdog` thread beside its training loop. It talks
through the job's key-value store (a ``torch.distributed.TCPStore``: our launcher hosts it
for local ranks; under ``torchrun`` it is the agent's store), never through a collective:

* **Heartbeat.** Every ``interval_s`` it advances ``hb/<rank>``. Once :meth:`arm` is
  called (after set-up, when every rank trains), a peer whose counter has not moved for
  ``stale_s`` is declared failed: "stopped responding". A stopped (SIGSTOP) or wedged
  process is named this way, not inferred from a survivor's time-out.
* **Failure flag.** The first rank that hits an error writes ``fail`` = ``{rank, kind,
  message}`` (first writer wins, by ``compare_set``). Every watchdog polls the key and, when
  another rank failed, ends its own process at once with :data:`EXIT_PEER_FAILED`: the job
  ends within about one interval, not after ``timeout_s``, and no rank waits on a barrier.
* **Parent watch.** ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` (Linux) kills the rank when its
  launcher dies by any signal, SIGKILL and the OOM killer included; the thread also checks
  ``getppid()`` as a portable fallback.
* **SIGTERM.** The main thread blocks SIGTERM (:func:`block_sigterm`, before any other
  thread exists) and the watchdog waits for it with ``sigtimedwait``, so a SIGTERM ends the
  rank promptly even while the main thread sits in a collective.

Written here: torch offers store primitives and per-collective time-outs, but no
heartbeat, failure broadcast or parent-death handling for worker processes.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from commgnn.errors import RankFailure

EXIT_PEER_FAILED = 3
"""Exit code of a rank stopped because another rank failed (it is not the culprit)."""
EXIT_SIGTERM = 143
"""Exit code after SIGTERM (128 + 15), as a shell reports it."""

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int, sig: int = signal.SIGKILL) -> None:
    """Make the kernel send ``sig`` (SIGKILL unless told) to this process when its parent
    dies (Linux); exit at once if the parent is already gone (the race between fork and this
    call). SIGTERM lets the watchdog record why the rank stopped before it exits."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the watchdog's getppid() check still covers it
    if os.getppid() != parent_pid:
        os._exit(EXIT_PEER_FAILED)


def _parent_of(pid: int) -> int | None:
    """``pid``'s parent from ``/proc`` (None where it cannot be read)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])  # after "pid (comm)": state, ppid


def die_with_launcher(launcher_pid: int) -> int:
    """:func:`die_with_parent` for a rank whose parent is ``launcher_pid`` itself or a fork
    server that ``launcher_pid`` started (the kernel kills that server when the launcher dies,
    and the server's death kills the rank). Exit at once if the launcher is already gone; return the parent."""
    parent = os.getppid()
    die_with_parent(parent)
    if parent != launcher_pid and _parent_of(parent) not in (launcher_pid, None):
        os._exit(EXIT_PEER_FAILED)  # the launcher died before the server noticed
    return parent


def process_end(pid: int) -> str | None:
    """How the process ``pid`` of this host ended, read from ``/proc`` without being its
    parent: ``"killed by SIGKILL"``, ``"exit code 1"`` (a zombie not yet reaped shows its
    status), ``"process gone"`` (already reaped: how is no longer known); None while it lives."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "process gone"
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] not in ("Z", "X"):
        return None
    try:
        status = int(fields[49])  # field 52 of proc(5), the wait status (Linux 3.5 and later)
    except (IndexError, ValueError):
        return "process gone"
    if os.WIFSIGNALED(status):
        try:
            return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
        except ValueError:
            return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit code {os.WEXITSTATUS(status)}"


def wait_sigterm(timeout_s: float) -> bool:
    """Whether a (blocked) SIGTERM arrived within ``timeout_s``. CPython's
    ``sigtimedwait`` returns a struct of garbage, not None, when the process is stopped
    and continued (SIGSTOP, SIGCONT: Ctrl-Z and ``fg``, a straggler's pause) while it
    waits, so the signal's number is checked: taken at its word, one pause of a rank
    ended the whole job as if it had been sent SIGTERM."""
    sig = signal.sigtimedwait({signal.SIGTERM}, timeout_s)
    return sig is not None and sig.si_signo == signal.SIGTERM


def block_sigterm() -> None:
    """Block SIGTERM in this thread (and in every thread started after): the watchdog
    receives it with ``sigtimedwait``. Call before any other thread starts."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


@dataclass(frozen=True)
class Failure:
    """What the ``fail`` key holds: the rank at fault and why."""

    rank: int
    kind: str
    """``error`` (raised in that rank), ``user`` (bad input found there), ``stopped`` (no
    heartbeat, named by a peer) or ``signal`` (SIGTERM)."""
    message: str

    def encode(self) -> str:
        return json.dumps({"rank": self.rank, "kind": self.kind, "message": self.message})

    @staticmethod
    def decode(raw: bytes | str) -> "Failure | None":
        try:
            d = json.loads(raw)
            return Failure(int(d["rank"]), str(d["kind"]), str(d["message"]))
        except (ValueError, KeyError, TypeError):
            return None


def read_failure(store: Any, prefix: str = "commgnn/") -> Failure | None:
    """The failure recorded in ``store`` (None when no rank failed)."""
    key = prefix + "fail"
    try:
        if not store.check([key]):
            return None
        return Failure.decode(store.get(key))
    except Exception:  # the store itself is gone: nothing to read
        return None


class Watchdog:
    """The per-rank thread described in the module docstring."""

    def __init__(self, store: Any, rank: int, world_size: int, *, stale_s: float,
                 interval_s: float = 0.5, prefix: str = "commgnn/", parent_pid: int | None = None,
                 on_sigterm: Callable[[], None] | None = None, handle_sigterm: bool = False) -> None:
        self.store, self.rank, self.world_size = store, rank, world_size
        self.stale_s, self.interval_s, self.prefix = stale_s, interval_s, prefix
        self.parent_pid = parent_pid
        self.on_sigterm = on_sigterm
        self.on_peer_failed: Callable[[Failure], None] | None = None
        """Called (in this thread) with the failure of another rank, just before this
        process ends because of it (torchrun: record the run's final state)."""
        self.on_parent_died: Callable[[], None] | None = None
        """Called just before this process ends because its parent (the launcher, or the
        torchrun agent, which hosts the store) is gone."""
        self.handle_sigterm = handle_sigterm
        self._armed = threading.Event()
        self._stop = threading.Event()
        self._failed_here = False
        self._thread = threading.Thread(target=self._loop, name=f"commgnn-watchdog{rank}", daemon=True)

    # -- called from the main thread --------------------------------------------------
    def start(self) -> "Watchdog":
        self.store.set(self._hb(self.rank), "0")
        self._thread.start()
        return self

    def arm(self) -> None:
        """Start judging peers by their heartbeat (call when every rank has finished set-up)."""
        self._armed.set()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * self.interval_s + 1)

    def report(self, kind: str, message: str, rank: int | None = None) -> Failure:
        """Record a failure (of this rank unless ``rank`` is given); the first one recorded
        wins and is returned, so every rank agrees on the culprit."""
        if rank is None:
            self._failed_here = True
            self.mark_end(kind)
        mine = Failure(self.rank if rank is None else rank, kind, message)
        try:
            raw = self.store.compare_set(self.prefix + "fail", "", mine.encode())
            return Failure.decode(raw) or mine
        except Exception:
            return mine

    def mark_end(self, how: str) -> None:
        """Record in the store that this rank ends knowingly (``complete``, ``signal``,
        ``error``, ``user``), so that a peer seeing it gone does not take it for a crash."""
        try:
            self.store.set(f"{self.prefix}end/{self.rank}", how)
        except Exception:  # the store's host is gone: nobody is left to read it
            pass

    def ended(self, rank: int) -> str | None:
        """How rank ``rank`` said it ends (:meth:`mark_end`); None when it did not."""
        try:
            key = f"{self.prefix}end/{rank}"
            return self.store.get(key).decode() if self.store.check([key]) else None
        except Exception:
            return None

    def wait_for_culprit(self, limit_s: float) -> Failure | None:
        """After a collective failed here: wait up to ``limit_s`` for the failure record (the
        culprit posts it, or a peer names a rank whose heartbeat stopped)."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            fail = read_failure(self.store, self.prefix)
            if fail is not None:
                return fail
            stale = self._stale_peers(since=self._last_seen, now=time.monotonic(), limit=3 * self.interval_s)
            if stale:
                return self.report("stopped", "exited or stopped responding (no heartbeat)", rank=stale[0])
            time.sleep(self.interval_s / 2)
        return None

    def publish(self, key: str, value: str) -> None:
        """Set ``key`` in the job's store for peers waiting in :meth:`wait_key`."""
        self.store.set(self.prefix + key, value)

    def wait_key(self, key: str, source: int, *, silent_s: float) -> str:
        """Wait until rank ``source`` publishes ``key``; return its value.

        For waits longer than a collective may block (rank 0 partitioning a large graph while
        the others wait). The wait ends when the key appears; when a rank records a failure
        (this rank's watchdog thread then ends the process); or with a :class:`RankFailure`
        naming ``source`` once its heartbeat has not moved for ``silent_s``. Give that
        limit room: a C extension that holds the GIL (pymetis does) stops the heartbeat
        thread of its process while it runs."""
        full, seen = self.prefix + key, {}
        limit = max(silent_s, self.stale_s)
        while True:
            try:
                if self.store.check([full]):
                    return self.store.get(full).decode()
            except Exception as exc:  # the store's host is gone
                raise RankFailure(f"rank {self.rank} of {self.world_size}: the job's store is "
                                  f"unreachable while waiting for rank {source} ({exc})") from None
            if self._stale_peers(since=seen, now=time.monotonic(), limit=limit, peers=[source]):
                raise RankFailure(f"rank {source} of {self.world_size} stopped responding (no heartbeat "
                                  f"for {limit:.0f} s) while rank {self.rank} waited for it")
            time.sleep(min(0.1, self.interval_s))

    # -- the thread -----------------------------------------------------------------
    def _hb(self, r: int) -> str:
        return f"{self.prefix}hb/{r}"

    _last_seen: dict[int, tuple[bytes, float]]

    def _stale_peers(self, *, since: dict[int, tuple[bytes, float]], now: float, limit: float,
                     peers: list[int] | None = None) -> list[int]:
        """Peers (all others by default) whose heartbeat value has not changed for ``limit``
        seconds (updates ``since``)."""
        if peers is None:
            peers = [r for r in range(self.world_size) if r != self.rank]
        keys = [self._hb(r) for r in peers]
        try:
            if not self.store.check(keys):  # a peer that never started beating is not judged
                return []
            values = self.store.multi_get(keys)
        except Exception:
            return []
        stale = []
        for r, v in zip(peers, values):
            last = since.get(r)
            if last is None or last[0] != v:
                since[r] = (v, now)
            elif now - last[1] > limit:
                stale.append(r)
        return stale

    def _loop(self) -> None:
        self._last_seen = {}
        beat = 0
        while not self._stop.is_set():
            if self.handle_sigterm:
                if wait_sigterm(self.interval_s):
                    if self.parent_pid is None or os.getppid() == self.parent_pid:
                        self.report("signal", "stopped by SIGTERM")
                    self._call(self.on_sigterm)
                    os._exit(EXIT_SIGTERM)
            else:
                self._stop.wait(self.interval_s)
            if self.parent_pid is not None and os.getppid() != self.parent_pid:
                self._call(self.on_parent_died)
                os._exit(EXIT_PEER_FAILED)  # the launcher is gone
            beat += 1
            try:
                self.store.set(self._hb(self.rank), str(beat))
            except Exception:
                # The store is unreachable: its host (launcher or torchrun agent) died.
                self._call(self.on_parent_died)
                os._exit(EXIT_PEER_FAILED)
            fail = read_failure(self.store, self.prefix)
            if fail is not None:
                if fail.rank != self.rank and not self._failed_here:
                    self._call(self.on_peer_failed, fail)
                    os._exit(EXIT_PEER_FAILED)
                continue
            if self._armed.is_set():
                stale = self._stale_peers(since=self._last_seen, now=time.monotonic(), limit=self.stale_s)
                if stale:
                    fail = self.report("stopped", f"stopped responding (no heartbeat for {self.stale_s:.0f} s)",
                                       rank=stale[0])
                    self._call(self.on_peer_failed, fail)
                    os._exit(EXIT_PEER_FAILED)

    @staticmethod
    def _call(fn: Callable[..., None] | None, *args: Any) -> None:
        """Run a callback on the way out; whatever it raises, the process still ends."""
        if fn is None:
            return
        try:
            fn(*args)
        except BaseException:  # noqa: BLE001 - the exit that follows must happen
            pass
