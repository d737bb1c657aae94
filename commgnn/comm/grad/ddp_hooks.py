"""torch's own DDP communication hooks, used as they are (not rewritten).

Strategies: ``fp16`` / ``bf16`` (``fp16_compress_hook`` / ``bf16_compress_hook``),
``powersgd`` (``PowerSGDState`` + ``powerSGD_hook``, error feedback and warm start on,
``start_powerSGD_iter >= 2``; optionally inside ``fp16_compress_wrapper``, so that P
and Q travel in fp16) and ``localsgd`` (``PostLocalSGDState`` with one-rank
subgroups + ``PeriodicModelAverager``). The model is wrapped in
``DistributedDataParallel`` on a process group of its own, so DDP's bucketed all-reduces
never interleave with the halo exchange's collectives.

Not offered: ``batched_powerSGD_hook`` and the quantization hooks, which crash on gloo
(techniques.md section 4, checked on 2 gloo ranks). ``bf16`` needs NCCL: torch 2.13 refuses
the bf16 hook on gloo ("required CUDA 11+ and NCCL 2.10+"), so it is a configuration error
there (checked here; techniques.md predates this).

Bytes: every ``all_reduce`` issued on the gradient group (by the hooks, in any thread, and
by the model averager) is counted as the ring algorithm's payload of the tensor handed
to it, through a counting wrapper around ``torch.distributed.all_reduce``.

DDP averages gradients; :meth:`DDPHookSync.sync` multiplies them by P so the trainer
gets the sum its loss normalisation expects.
"""

from __future__ import annotations

import copy
import threading
import time
from typing import Any, Iterable

import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from commgnn.comm.collectives import ring_allreduce_bytes
from commgnn.comm.grad.powersgd_layout import bucket_segments, permute_state
from commgnn.comm.grad_sync import GradSyncBase
from commgnn.distributed.context import DistContext
from commgnn.distributed.events import Hooks, TimeEvent
from commgnn.errors import UserError

_patch_lock = threading.Lock()
_counted: dict[int, tuple[Any, Hooks, int]] = {}  # id(group) -> (group, hooks, world size)
_original_all_reduce = dist.all_reduce


def _counting_all_reduce(tensor: Any, op: Any = dist.ReduceOp.SUM, group: Any = None, async_op: bool = False):
    entry = _counted.get(id(group))
    if entry is not None:
        _, hooks, P = entry
        hooks.sent("grad_sync", -1, -1, ring_allreduce_bytes(tensor.numel(), tensor.element_size(), P))
    return _original_all_reduce(tensor, op=op, group=group, async_op=async_op)


def _count_group(group: Any, hooks: Hooks, world_size: int) -> None:
    with _patch_lock:
        _counted[id(group)] = (group, hooks, world_size)
        dist.all_reduce = _counting_all_reduce


def one_bucket_mb(model: nn.Module) -> float:
    """A DDP bucket cap (MiB) that holds every gradient of ``model`` in one bucket."""
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return max(25.0, 2 * nbytes / 2**20)


class DDPHookSync(GradSyncBase):
    """Gradient sync by DDP with one of torch's comm hooks."""

    def __init__(self, ctx: DistContext, hooks: Hooks, *, strategy: str, rank: int = 2,
                 start_iter: int = 10, period: int = 4, half: bool = False, prescale: bool = False) -> None:
        if strategy == "bf16" and ctx.is_distributed and ctx.backend != "nccl":
            raise UserError("comm.grad.strategy = 'bf16' needs the NCCL backend (torch refuses its bf16 "
                            "hook on gloo); use 'fp16' on CPU")
        self.ctx, self.hooks, self.strategy = ctx, hooks, strategy
        self.rank, self.start_iter, self.period, self.half = rank, start_iter, period, half
        self.prescale = prescale
        self.ddp: DistributedDataParallel | None = None
        self.state: Any = None
        self.averager: Any = None
        self.group = ctx.new_group()
        self._comm_start: float | None = None  # this step's first bucket handed to its hook
        self._comm_end: float | None = None    # and the last bucket's result in
        self._keys: dict[int, int] = {}         # id(parameter) -> its index in the model
        self._order: dict[int, list[int]] = {}  # bucket -> parameter indices its PowerSGD state is laid out in

    def wrap(self, model: nn.Module) -> nn.Module:
        """Wrap ``model`` in DDP with the configured hook (identity for one rank)."""
        if not self.ctx.is_distributed:
            return model
        _count_group(self.group, self.hooks, self.ctx.world_size)
        ids = [self.ctx.device.index] if self.ctx.device.type == "cuda" else None
        # One bucket for all gradients. torch's PowerSGD hook issues its later all-reduces
        # from future callbacks; with several buckets on gloo, one bucket's callbacks and the
        # next bucket's first all-reduce can reach the process group in a different order
        # on different ranks. Observed: gloo "Received data size doesn't match" on CS with
        # GraphSAGE (3.5 MB of first-layer weights, past DDP's 1 MiB first bucket).
        # An explicit bucket_cap_mb also sets DDP's first-bucket cap to it.
        self.ddp = DistributedDataParallel(model, device_ids=ids, process_group=self.group,
                                           bucket_cap_mb=one_bucket_mb(model))
        if self.strategy in ("fp16", "bf16"):
            hook = default_hooks.fp16_compress_hook if self.strategy == "fp16" else default_hooks.bf16_compress_hook
            self.ddp.register_comm_hook(self.group, self._timed(self._maybe_prescaled(hook)))
        elif self.strategy == "powersgd":
            self.state = powerSGD_hook.PowerSGDState(
                process_group=self.group, matrix_approximation_rank=self.rank,
                start_powerSGD_iter=max(2, self.start_iter), use_error_feedback=True, warm_start=True)
            hook = powerSGD_hook.powerSGD_hook
            if self.half:
                hook = self._maybe_prescaled(default_hooks.fp16_compress_wrapper(hook))
            self._keys = {id(p): i for i, p in enumerate(model.parameters())}
            self.ddp.register_comm_hook(self.state, self._timed(self._layout_tracked(hook)))
        elif self.strategy == "localsgd":
            from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (PostLocalSGDState,
                                                                                        post_localSGD_hook)
            from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

            subgroup, _ = dist.new_subgroups(group_size=1)  # gloo needs an explicit subgroup
            self.state = PostLocalSGDState(process_group=self.group, subgroup=subgroup,
                                           start_localSGD_iter=self.start_iter)
            self.ddp.register_comm_hook(self.state, self._timed(post_localSGD_hook))
            self.averager = PeriodicModelAverager(period=self.period, warmup_steps=self.start_iter,
                                                  process_group=self.group)
        return self.ddp

    def _timed(self, hook: Any) -> Any:
        """``hook`` with its wall time recorded, from the first bucket handed to it to the
        last bucket's result: DDP's all-reduce runs inside ``backward()`` (one bucket, at its
        end), so without this the meter would book it, and the wait for the slowest rank in
        it, as compute. :meth:`sync` books it as ``comm``."""
        # No annotations: DDP refuses a hook whose ``bucket`` annotation is not dist.GradBucket.
        def run(state, bucket):  # type: ignore[no-untyped-def]
            if self._comm_start is None:
                self._comm_start = time.perf_counter()

            def done(fut: Any) -> Any:
                self._comm_end = time.perf_counter()
                return fut.value()

            return hook(state, bucket).then(done)

        return run

    def _layout_tracked(self, hook: Any) -> Any:
        """``hook`` (PowerSGD) with its state moved to the bucket's current parameter order
        whenever that differs from the order the state was built in: DDP's one bucket
        rebuild, and a resumed run's new DDP (see :mod:`.powersgd_layout`)."""
        def run(state, bucket):  # type: ignore[no-untyped-def]
            b = bucket.index()
            shapes = {self._keys[id(p)]: p.shape for p in bucket.parameters()}
            order = list(shapes)
            built = self._order.get(b)
            if built is not None and built != order:
                if set(built) != set(order):  # we keep one bucket (wrap): a rebuild only reorders it
                    raise RuntimeError("PowerSGD state: DDP's bucket holds other parameters than before")
                r, rate = state.matrix_approximation_rank, state.min_compression_rate
                permute_state(state, b, bucket_segments(built, shapes, r, rate), bucket_segments(order, shapes, r, rate))
            self._order[b] = order
            return hook(state, bucket)

        return run

    def _maybe_prescaled(self, hook: Any) -> Any:
        from commgnn.comm.grad.prescale import prescaled

        return prescaled(hook, self.group) if self.prescale else hook

    def sync(self, params: Iterable[nn.Parameter]) -> None:
        """DDP already averaged during backward; turn the average into the sum (and book
        the hook's time as communication)."""
        if not self.ctx.is_distributed:
            return
        if self._comm_start is not None and self._comm_end is not None:
            self.hooks.emit(TimeEvent("comm", max(0.0, self._comm_end - self._comm_start)))
        self._comm_start = self._comm_end = None
        for p in params:
            if p.grad is not None:
                p.grad.mul_(self.ctx.world_size)

    def after_step(self, params: Iterable[nn.Parameter]) -> None:
        if self.averager is not None:
            self.averager.average_parameters(list(params))

    def state_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.strategy == "powersgd" and self.state is not None:
            # with the parameter order they are laid out in, so that a new DDP's other
            # order is undone on load, and the generator that seeds a new bucket's Qs
            out["powersgd"] = copy.deepcopy({"error_dict": self.state.error_dict, "p_memory": self.state.p_memory_dict,
                                             "q_memory": self.state.q_memory_dict, "iter": self.state.iter,
                                             "order": self._order, "rng": self.state.rng.get_state()})
        if self.strategy == "localsgd" and self.state is not None:
            out["localsgd_iter"] = self.state.iter
        if self.averager is not None:
            out["averager_step"] = self.averager.step
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "powersgd" in state and self.state is not None:
            s = state["powersgd"]
            self.state.error_dict, self.state.p_memory_dict = s["error_dict"], s["p_memory"]
            self.state.q_memory_dict, self.state.iter = s["q_memory"], s["iter"]
            self._order = {int(b): list(o) for b, o in s.get("order", {}).items()}
            if "rng" in s:
                self.state.rng.set_state(s["rng"])
        if "localsgd_iter" in state and self.state is not None:
            self.state.iter = state["localsgd_iter"]
        if "averager_step" in state and self.averager is not None:
            self.averager.step = state["averager_step"]
