"""CPU shares of emulated hosts (``--host-cpus``): one CPU cgroup a host.

Host ``i`` gets the cgroup ``commgnn-<pid>-h<i>`` beside this process's own CPU cgroup,
capped at ``c_i`` cores: cgroup v1 ``cpu.cfs_quota_us = c_i x cpu.cfs_period_us``, v2
``cpu.max = "c_i x period period"``. The host's torchrun agent enters it before it executes
(``preexec_fn``), so the agent and every rank it starts are charged there and together
never run faster than ``c_i`` cores. The shares must add up to at most the machine's
cores: then each host's speed is its quota, not the noise of the others.

Each limit is checked where it is set; a machine where it cannot be set (no CPU controller,
no write access) refuses the job in one line before any host starts. The cgroups are
removed when the job ends, however it ends, and :func:`remove_stale` removes those of a
killed emulation. Written here: no maintained Python library manages CPU cgroups for a
process tree (``cgroupspy`` and ``cgroup-utils`` are unmaintained and v1-only).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Callable, Sequence

from commgnn.distributed.memory import own_cgroup
from commgnn.errors import UserError

PERIOD_US = 100_000
"""The quota's period: 100 ms, the kernel's default."""


class HostCPUs:
    """The CPU cgroups of ``shares`` (cores a host) for the emulation of process ``owner_pid``;
    a context manager that removes them."""

    def __init__(self, shares: Sequence[float], *, owner_pid: int | None = None, cores: int | None = None) -> None:
        self.shares = tuple(float(c) for c in shares)
        cores = (os.cpu_count() or 1) if cores is None else cores
        if sum(self.shares) > cores + 1e-9:
            raise UserError(f"--host-cpus adds up to {sum(self.shares):g} cores and this machine has {cores}: keep the "
                            f"sum at most {cores}, so that each host's speed is its share")
        found = own_cgroup("cpu")
        if found is None:
            raise UserError("--host-cpus needs a CPU cgroup controller (cgroup v1 `cpu` or v2), and this machine "
                            "mounts neither")
        self.parent, self.v1 = found
        pid = os.getpid() if owner_pid is None else owner_pid
        self.paths = [self.parent / f"commgnn-{pid}-h{i}" for i in range(len(self.shares))]
        self._made: list[Path] = []

    def __enter__(self) -> "HostCPUs":
        try:
            if not self.v1:
                _enable_cpu(self.parent)
            for path, share in zip(self.paths, self.shares):
                path.mkdir()
                self._made.append(path)
                quota = max(1000, int(round(share * PERIOD_US)))
                if self.v1:
                    (path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
                    (path / "cpu.cfs_quota_us").write_text(str(quota))
                else:
                    (path / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        except OSError as exc:
            self.close()
            raise UserError(f"--host-cpus: cannot set a CPU cgroup under {self.parent} ({exc.strerror or exc}); run "
                            f"as root with cgroups writable, or drop --host-cpus") from None
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def quota(self, host: int) -> float:
        """The cores host ``host``'s cgroup allows, read back from the kernel."""
        path = self.paths[host]
        if self.v1:
            quota = int((path / "cpu.cfs_quota_us").read_text())
            period = int((path / "cpu.cfs_period_us").read_text())
        else:
            q, p = (path / "cpu.max").read_text().split()
            quota, period = (-1 if q == "max" else int(q)), int(p)
        return float("inf") if quota < 0 else quota / period

    def enter_fn(self, host: int) -> Callable[[], None]:
        """A ``preexec_fn`` that moves the child into host ``host``'s cgroup before it executes."""
        procs = str(self.paths[host] / "cgroup.procs")

        def enter() -> None:
            with open(procs, "w") as fh:
                fh.write(str(os.getpid()))
        return enter

    def close(self) -> None:
        """Remove the cgroups (a cgroup goes once its processes have exited; retried 5 s)."""
        while self._made:
            path = self._made.pop()
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


def _enable_cpu(parent: Path) -> None:
    """cgroup v2: the CPU controller enabled for the parent's children (``+cpu``)."""
    control = parent / "cgroup.subtree_control"
    if "cpu" not in control.read_text().split():
        control.write_text("+cpu")


def remove_stale() -> list[str]:
    """Remove the host CPU cgroups of emulations whose process is gone; their names."""
    found = own_cgroup("cpu")
    if found is None:
        return []
    removed = []
    for path in found[0].glob("commgnn-*-h*"):
        m = re.fullmatch(r"commgnn-(\d+)-h\d+", path.name)
        if m is None or _alive(int(m.group(1))):
            continue
        try:
            path.rmdir()
            removed.append(path.name)
        except OSError:
            pass
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
