"""Processes of one system on the emulated hosts: started in their namespaces, every
output line stamped with the monotonic clock as it arrives, and the summed PSS of every
process inside the namespaces sampled (servers, samplers, launchers and trainers alike).

A host's processes may get a private ``/dev/shm`` (``unshare -m`` and a fresh tmpfs):
DistDGL names its shared-memory segments after the graph only, so two "machines" on one
kernel would otherwise read each other's partitions.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from commgnn.cluster.netns import namespace_pids


@dataclass
class Line:
    t: float
    host: int
    name: str
    text: str


@dataclass
class Job:
    """One process to start on host ``host``: ``argv`` with ``env`` added, in ``cwd``."""
    host: int
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    private_shm: bool = False


class HostProcesses:
    """Start :class:`Job` s inside the namespaces of ``prefixes`` (one command prefix a
    host); collect their stamped lines in :attr:`lines` and logs under ``log_dir``."""

    def __init__(self, prefixes: Sequence[Sequence[str]], namespaces: Sequence[str], log_dir: Path) -> None:
        self.prefixes, self.namespaces, self.log_dir = [list(p) for p in prefixes], list(namespaces), log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        self.procs: list[tuple[Job, subprocess.Popen[bytes]]] = []
        self.lines: list[Line] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def start(self, job: Job) -> None:
        env = {**os.environ, **job.env}
        argv = job.argv
        if job.private_shm:
            inner = "mount -t tmpfs -o size=4g tmpfs /dev/shm && exec " + " ".join(shlex.quote(a) for a in argv)
            argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", inner]
        p = subprocess.Popen([*self.prefixes[job.host], *argv], env=env, cwd=job.cwd, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append((job, p))
        t = threading.Thread(target=self._pump, args=(job, p), daemon=True)
        t.start()
        self._threads.append(t)

    def _pump(self, job: Job, p: subprocess.Popen[bytes]) -> None:
        assert p.stdout is not None
        with open(self.log_dir / f"{job.name}.log", "w") as log:
            for raw in iter(p.stdout.readline, b""):
                now = time.monotonic()
                text = raw.decode(errors="replace").rstrip("\n")
                log.write(f"{now:.3f} {text}\n")
                log.flush()
                with self._lock:
                    self.lines.append(Line(now, job.host, job.name, text))

    def wait(self, names: Sequence[str], timeout_s: float) -> dict[str, int | None]:
        """Wait for the named jobs to exit (at most ``timeout_s``); their exit codes (None: still running)."""
        deadline = time.monotonic() + timeout_s
        chosen = [(j, p) for j, p in self.procs if j.name in names]
        while time.monotonic() < deadline and any(p.poll() is None for _, p in chosen):
            if any(p.returncode not in (None, 0) for _, p in chosen):
                break
            time.sleep(min(0.05, max(deadline - time.monotonic(), 0.0)))
        return {j.name: p.poll() for j, p in chosen}

    def stop(self) -> None:
        """SIGTERM, then SIGKILL, every job and every process left in the namespaces."""
        for _, p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        time.sleep(1.0)
        for ns in self.namespaces:
            for pid in namespace_pids(ns):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for _, p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for t in self._threads:
            t.join(timeout=5)

    def matching(self, pattern: str, host: int | None = None) -> list[tuple[float, re.Match[str]]]:
        rx = re.compile(pattern)
        with self._lock:
            lines = list(self.lines)
        return [(ln.t, m) for ln in lines if (host is None or ln.host == host) and (m := rx.search(ln.text))]


def pss_kb(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    m = re.search(r"^Pss:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) if m else 0


class PssSampler:
    """The peak over time of the summed PSS of every process in ``namespaces`` (and of
    ``extra`` pids, e.g. a launcher outside them), sampled every ``interval_s``."""

    def __init__(self, namespaces: Sequence[str], extra: Sequence[int] = (), interval_s: float = 1.0) -> None:
        self.namespaces, self.extra, self.interval_s = list(namespaces), list(extra), interval_s
        self.peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "PssSampler":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            pids = {p for ns in self.namespaces for p in namespace_pids(ns)} | set(self.extra)
            self.peak_kb = max(self.peak_kb, sum(pss_kb(p) for p in pids))
