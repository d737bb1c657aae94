"""Run a command inside a memory cgroup with a hard cap, and measure what it used.

What a user on a machine with ``cap`` bytes gets: the command and every process it starts
run in a fresh memory cgroup (v1 ``memory.limit_in_bytes`` or v2 ``memory.max``). The
kernel counts anonymous memory *and* page cache against the cap and reclaims the cache
when the cap is reached, so a memory-mapped file does not count twice, and a job that
truly needs more than the cap is OOM-killed (recorded in :attr:`CappedRun.oom_killed`).

While it runs, every ``interval`` seconds each live process of the cgroup is read from
``/proc/<pid>/smaps_rollup``; the peaks of the summed PSS (proportional set size: a page
shared by k processes counts 1/k to each, so the sum counts it once), of its anonymous
part and of its file-backed part are kept, with the cgroup's own peak
(``memory.max_usage_in_bytes`` / ``memory.peak``, which includes page cache).

Written here because no maintained Python library runs a command under a cgroup cap and
samples PSS across its process tree (psutil reads one process's PSS, not a cgroup's).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from commgnn.distributed.memory import own_cgroup



@dataclass
class CappedRun:
    """What one command did under the cap (bytes, seconds)."""

    returncode: int
    wall_s: float
    cap_bytes: int
    peak_pss: int = 0
    """Largest sum over the cgroup's processes of PSS at one sample."""
    peak_pss_anon: int = 0
    """Largest summed anonymous PSS (heap, tensors: what cannot be reclaimed)."""
    peak_pss_file: int = 0
    """Largest summed file-backed PSS (memory-mapped files, code)."""
    peak_cgroup: int = 0
    """The cgroup's own peak charge, page cache included."""
    peak_processes: int = 0
    """Most processes alive in the cgroup at one sample."""
    oom_killed: bool = False
    """The kernel killed a process of the cgroup for exceeding the cap."""
    samples: int = 0
    per_process_peak: dict[str, int] = field(default_factory=dict)
    """Peak PSS by process command line (first 60 characters), the launcher's and each rank's."""

    def row(self) -> dict[str, float | int | bool]:
        gb = 1 << 30
        return {"wall_s": round(self.wall_s, 1), "cap_gb": round(self.cap_bytes / gb, 2),
                "peak_pss_gb": round(self.peak_pss / gb, 3), "peak_anon_gb": round(self.peak_pss_anon / gb, 3),
                "peak_file_gb": round(self.peak_pss_file / gb, 3), "cgroup_peak_gb": round(self.peak_cgroup / gb, 3),
                "processes": self.peak_processes, "oom_killed": self.oom_killed, "rc": self.returncode}


class MemoryCgroup:
    """A fresh memory cgroup under this process's own, capped at ``cap_bytes``; removed on
    :meth:`close`. Raises ``OSError`` when cgroups cannot be written here (no permission, no
    memory controller): callers skip with that reason."""

    def __init__(self, cap_bytes: int) -> None:
        self.cap = int(cap_bytes)
        name = f"commgnn-cap-{uuid.uuid4().hex[:8]}"
        found = own_cgroup()
        if found is None:
            raise OSError("no memory cgroup here (neither v1's memory controller nor v2)")
        parent, self.v1 = found
        self.path = parent / name
        self.path.mkdir()
        (self.path / ("memory.limit_in_bytes" if self.v1 else "memory.max")).write_text(str(self.cap))
        if not self.v1 and (self.path / "memory.swap.max").exists():
            (self.path / "memory.swap.max").write_text("0")  # the cap is on memory, not memory + swap

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def peak(self) -> int:
        f = self.path / ("memory.max_usage_in_bytes" if self.v1 else "memory.peak")
        try:
            return int(f.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return 0

    def oom_kills(self) -> int:
        try:
            text = (self.path / ("memory.oom_control" if self.v1 else "memory.events")).read_text()
        except OSError:
            return 0
        for line in text.splitlines():
            k, _, v = line.partition(" ")
            if k == "oom_kill":
                return int(v)
        return 0

    def enter_fn(self) -> Callable[[], None]:
        procs = str(self.path / "cgroup.procs")

        def enter() -> None:  # in the child, before exec: it and all it starts are charged here
            with open(procs, "w") as fh:
                fh.write(str(os.getpid()))
        return enter

    def close(self) -> None:
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def _rollup(pid: int) -> tuple[int, int, int] | None:
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    vals = {}
    for line in text.splitlines()[1:]:
        k, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            vals[k] = int(parts[0]) * 1024
    return vals.get("Pss", 0), vals.get("Pss_Anon", 0), vals.get("Pss_File", 0)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:60]
    except OSError:
        return str(pid)


def run_capped(cmd: Sequence[str], cap_bytes: int, *, env: Mapping[str, str] | None = None,
               cwd: str | Path | None = None, interval: float = 0.5, timeout: float | None = None,
               stdout: int | None = None, stderr: int | None = None) -> CappedRun:
    """Run ``cmd`` in a fresh cgroup capped at ``cap_bytes`` and sample its processes' PSS.
    Raises ``OSError`` when no cgroup can be made here."""
    cg = MemoryCgroup(cap_bytes)
    res = CappedRun(returncode=-1, wall_s=0.0, cap_bytes=cg.cap)
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            pss = anon = fil = 0
            pids = cg.pids()
            for pid in pids:
                got = _rollup(pid)
                if got is None:
                    continue
                pss, anon, fil = pss + got[0], anon + got[1], fil + got[2]
                key = f"{pid} {_cmdline(pid)}"
                res.per_process_peak[key] = max(res.per_process_peak.get(key, 0), got[0])
            res.peak_pss = max(res.peak_pss, pss)
            res.peak_pss_anon = max(res.peak_pss_anon, anon)
            res.peak_pss_file = max(res.peak_pss_file, fil)
            res.peak_processes = max(res.peak_processes, len(pids))
            res.samples += 1
            stop.wait(interval)

    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen(list(cmd), env=None if env is None else dict(env), cwd=cwd,
                                preexec_fn=cg.enter_fn(), stdout=stdout, stderr=stderr)
        th = threading.Thread(target=sample, daemon=True)
        th.start()
        try:
            res.returncode = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            res.returncode = proc.wait()
        stop.set()
        th.join()
        res.wall_s = time.perf_counter() - t0
        res.peak_cgroup = cg.peak()
        res.oom_killed = cg.oom_kills() > 0
    finally:
        stop.set()
        for pid in cg.pids():  # anything the command left behind dies with the measurement
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        cg.close()
    return res
