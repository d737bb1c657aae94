"""Memory available to this process: the host's, or less where a memory cgroup caps it.

``psutil.virtual_memory().available`` reads the host. In a container, a batch job or any
process under a cgroup memory cap (v1 ``memory.limit_in_bytes``, v2 ``memory.max``, on
this process's cgroup or an ancestor), what the process may still use is the cap minus
what the cgroup holds that cannot be reclaimed (its anonymous memory; page cache is
reclaimed under the cap). Every "0 = available memory" default (the pre-flight check,
the partitioner's memory check and its out-of-core switch, the mini-batch topology and
cache sizing) reads :func:`available_bytes`, so a job in a 20 GB cgroup on a 64 GB host
is judged against 20 GB.

Written here because psutil reads the host's memory, not a cgroup's.
"""

from __future__ import annotations

from pathlib import Path

import psutil

_ROOT = Path("/sys/fs/cgroup")


def _stat(path: Path, keys: tuple[str, ...]) -> int:
    """The first of ``keys`` found in the cgroup's ``memory.stat`` (0 where none is)."""
    try:
        stat = dict(line.split(" ", 1) for line in (path / "memory.stat").read_text().splitlines() if " " in line)
        return next((int(stat[k]) for k in keys if k in stat), 0)
    except (OSError, ValueError):
        return 0


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return None if text in ("", "max") else int(text)


def own_cgroup(controller: str = "memory") -> tuple[Path, bool] | None:
    """This process's cgroup folder for ``controller`` (``memory``, ``cpu``) and whether it
    is cgroup v1 (None where neither v1's controller nor v2 is mounted)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        if controller in controllers.split(",") and (_ROOT / controller).is_dir():
            return _ROOT / controller / rel.lstrip("/"), True
    for line in lines:
        if line.startswith("0::") and (_ROOT / "cgroup.controllers").exists():
            return _ROOT / line[3:].lstrip("/"), False
    return None


def cgroup_headroom() -> int | None:
    """Bytes this process's cgroup (or its tightest capped ancestor) may still take, or
    None where no cgroup caps it (or none can be read)."""
    found = own_cgroup()
    if found is None:
        return None
    path, v1 = found
    base = _ROOT / "memory" if v1 else _ROOT
    best: int | None = None
    while True:
        limit = _read_int(path / ("memory.limit_in_bytes" if v1 else "memory.max"))
        if limit is not None and limit < 1 << 60:  # v1 writes a huge number for "no limit"
            room = max(0, limit - _stat(path, ("total_rss", "rss") if v1 else ("anon",)))
            best = room if best is None else min(best, room)
        if path == base or base not in path.parents:
            return best
        path = path.parent


def available_bytes() -> float:
    """The host's available memory, or the cgroup's headroom where that is smaller."""
    host = float(psutil.virtual_memory().available)
    room = cgroup_headroom()
    return host if room is None else min(host, float(room))
