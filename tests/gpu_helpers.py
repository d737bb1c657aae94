"""Running test functions on NCCL ranks, for the ``gpu`` tests (``tests/test_gpu.py``,
``tests/test_gpu_levers.py``).

Every gpu test skips where ``torch.cuda.is_available()`` is false (CI, CPU machines): each
module sets ``pytestmark = GPU_MARKS``; the multi-rank ones also carry :data:`two_gpus`,
which skips them where fewer than two GPUs are visible (NCCL refuses two ranks on one GPU).

One GPU still runs NCCL: :func:`run_ranks` at world size 1 starts one rank on a real NCCL
communicator of world size 1 whose context says it is distributed (:class:`SelfContext`),
so every collective the code issues really runs (the halo all-to-all sending rows to
itself, DDP with its comm hooks, all-reduces, broadcasts), which a world of one never does
otherwise. Traffic between GPUs needs the two-GPU cases. Traffic between ranks on one GPU
runs on gloo (:data:`SHARED_GPU`): two ranks share the GPU, and gloo moves their device
tensors through the host, so the multi-rank code paths (MaxK's (index, value) messages,
uneven splits, the ranks' differing halos) run on CUDA tensors with one GPU.

The rank functions are device-agnostic: on a CPU machine the same cases run on gloo
(``backend="gloo"``), which is how their tolerances were set without a GPU.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch
import torch.distributed as dist

from commgnn.distributed.context import (DistContext, LaunchInfo, RuntimeConfig, free_port, init_distributed,
                                  shutdown)
from commgnn.distributed.spawn import first_line, spawn_ranks

CUDA = torch.cuda.is_available()
#: A stuck collective fails after this many seconds, naming itself (GPU_TEST_COLLECTIVE_TIMEOUT_S
#: shortens it where a device check has little time).
COLLECTIVE_TIMEOUT_S = float(os.environ.get("GPU_TEST_COLLECTIVE_TIMEOUT_S", "120"))
NGPU = torch.cuda.device_count() if CUDA else 0

GPU_MARKS = [
    pytest.mark.gpu,
    pytest.mark.skipif(not CUDA, reason="needs an NVIDIA GPU: torch.cuda.is_available() is False "
                                        "(CPU machines and CI skip the gpu tests)"),
]
two_gpus = pytest.mark.skipif(CUDA and NGPU < 2, reason=f"multi-rank NCCL needs >= 2 GPUs (NCCL refuses two "
                                                         f"ranks on one GPU); {NGPU} visible")


#: Keyword arguments of :func:`run_ranks` for ranks that share one GPU over gloo
#: (``runtime.device = "cuda"``, ``runtime.backend = "gloo"``; only the first visible GPU is
#: shown to them): their device tensors really travel between processes, staged through the
#: host by gloo, which needs only one GPU.
SHARED_GPU = {"backend": "gloo", "device": "cuda"}


class SelfContext(DistContext):
    """One rank that takes the distributed code paths: its collectives run on a real
    process group of world size 1 (each exchange sends the rank's rows to itself)."""

    @property
    def is_distributed(self) -> bool:  # type: ignore[override]
        return True


def to_cpu(obj: Any) -> Any:
    """``obj`` with every tensor moved to the CPU (results travel back through torch.save)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


def _self_entry(info: LaunchInfo, fn: Callable[..., Any], out_dir: str, backend: str, args: tuple,
                device: str) -> None:
    timeout = _dt.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    dev = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    torch.set_num_threads(1)
    store = dist.TCPStore(info.master_addr, info.port, None, False, timeout=timeout)
    dist.init_process_group(backend, store=dist.PrefixStore("pg/", store), rank=0, world_size=1, timeout=timeout)
    ctx = SelfContext(rank=0, world_size=1, local_rank=0, local_world_size=1, device=dev, backend=backend,
                      timeout_s=COLLECTIVE_TIMEOUT_S, group=dist.group.WORLD)
    result = fn(ctx, *args)
    torch.save(to_cpu(result), Path(out_dir) / "rank0.pt")
    dist.barrier()
    dist.destroy_process_group()


def _dist_entry(info: LaunchInfo, fn: Callable[..., Any], out_dir: str, backend: str, args: tuple,
                device: str) -> None:
    ctx = init_distributed(info, RuntimeConfig(parts=info.world_size, backend=backend, device=device,
                                               timeout_s=COLLECTIVE_TIMEOUT_S, threads=1))
    assert ctx.backend == backend and ctx.device.type == device, (ctx.backend, ctx.device)
    result = fn(ctx, *args)
    torch.save(to_cpu(result), Path(out_dir) / f"rank{ctx.rank}.pt")
    shutdown(ctx)


@contextlib.contextmanager
def _one_gpu_visible() -> Iterator[None]:
    """Ranks spawned in the block see only the first visible GPU, so that gloo ranks share
    it also on a machine with several (``pick_device`` would give each its own)."""
    old = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = (old or "0").split(",")[0]
    try:
        yield
    finally:
        if old is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = old


def run_ranks(fn: Callable[..., Any], world_size: int, tmp_path: Path, *args: Any,
              backend: str = "nccl", device: str | None = None) -> list[Any]:
    """``fn(ctx, *args)`` on ``world_size`` spawned ranks (one GPU each under NCCL; under
    gloo on the CPU, or with ``device="cuda"`` all on the one GPU, see :data:`SHARED_GPU`);
    world size 1 runs one :class:`SelfContext` rank. Returns each rank's result, on the CPU."""
    entry = _self_entry if world_size == 1 else _dist_entry
    device = device or ("cuda" if backend == "nccl" else "cpu")
    shared = backend == "gloo" and device == "cuda"
    with _one_gpu_visible() if shared else contextlib.nullcontext():
        spawn_ranks(entry, (fn, str(tmp_path), backend, args, device), nprocs=world_size,
                    master_addr="127.0.0.1", port=free_port())
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world_size)]


def error_text(exc: BaseException) -> str:
    """An exception in one line (its type and first line), as a failed case records it."""
    return f"{type(exc).__name__}: {first_line(exc)}"
