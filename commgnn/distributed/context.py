"""The distributed runtime: one :class:`DistContext`, built once and passed explicitly.

Library code never calls ``dist.get_rank()`` or reads environment variables: the CLI
reads ``torchrun``'s environment (:func:`launch_info_from_env`), builds the context with
:func:`init_distributed` and hands it down. A world of size 1 never creates a process
group, so every strategy's world-size-1 path runs without ``torch.distributed``.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import os
import signal
import socket
import warnings
from dataclasses import dataclass
from typing import Mapping

import torch
import torch.distributed as dist

from commgnn.distributed.watchdog import Watchdog, block_sigterm, die_with_parent
from commgnn.errors import UserError
from commgnn.distributed.config import RuntimeConfig  # noqa: F401 (its home is config.py)


@dataclass(frozen=True, kw_only=True)
class LaunchInfo:
    """Where this process sits in the job, as the launcher told it."""

    rank: int
    """Global rank of this process."""
    world_size: int
    """Number of ranks in the job."""
    local_rank: int
    """Rank among the processes on this machine (selects the GPU)."""
    local_world_size: int
    """Processes on this machine (they share its cores)."""
    master_addr: str
    """Rendezvous host."""
    port: int
    """Rendezvous port (where our launcher hosts the store; torchrun's MASTER_PORT)."""
    external: bool = False
    """True under torchrun (rendezvous via its environment), False for our own spawner."""
    launcher_pid: int | None = None
    """Our launcher's pid (local ranks die with it); None under torchrun."""
    parent_pid: int | None = None
    """This rank's parent, whose death ends it: the launcher, or the fork server the launcher
    started (set in the rank itself; None under torchrun)."""
    heartbeat_s: float = 30.0
    """Heartbeat time-out the launcher chose (see ``RuntimeConfig.heartbeat_s``)."""
    restart_count: int = 0
    """torchrun's restart count (``TORCHELASTIC_RESTART_COUNT``): > 0 after an elastic restart."""


@dataclass(frozen=True, kw_only=True)
class DistContext:
    """Rank, world size, device and process group of this process."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str
    timeout_s: float
    group: dist.ProcessGroup | None = None
    """The default group (None when world_size == 1)."""
    watchdog: Watchdog | None = None
    """This rank's heartbeat and failure watcher (None when world_size == 1)."""
    split_wait: bool = False
    """``runtime.split_wait``: a barrier before each halo exchange, timed as ``wait``."""

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def comm_device(self) -> torch.device:
        """Where a tensor made on the host goes for a collective: the device under NCCL
        (which moves device tensors only), else the host (gloo reads host memory, and
        stages device tensors through it itself, so sending a host payload from a GPU rank
        saves gloo a copy there and back)."""
        return self.device if self.backend == "nccl" else torch.device("cpu")

    def new_group(self) -> dist.ProcessGroup | None:
        """A second communicator over every rank (for collectives on a background thread),
        with this run's collective time-out; ``torch.distributed.new_group`` alone would give
        gloo's 30-minute default, so a hang there would outlast ``runtime.timeout_s``. Every
        rank must call it, in the same order. None for one rank."""
        if not self.is_distributed:
            return None
        return dist.new_group(ranks=list(range(self.world_size)), timeout=_dt.timedelta(seconds=self.timeout_s))

    def barrier(self) -> None:
        if self.is_distributed:
            dist.barrier(group=self.group)

    def all_reduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """In-place all-reduce (``sum`` | ``max`` | ``min``); a no-op for one rank."""
        if self.is_distributed:
            ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
            if self.backend == "nccl" and t.device != self.device:
                # NCCL reduces device tensors only; bookkeeping vectors live on the CPU.
                on_dev = t.to(self.device)
                dist.all_reduce(on_dev, op=ops[op], group=self.group)
                t.copy_(on_dev.cpu())
            else:
                dist.all_reduce(t, op=ops[op], group=self.group)
        return t

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        """``[P, *t.shape]``: every rank's ``t`` (same shape everywhere), in rank order."""
        if not self.is_distributed:
            return t.unsqueeze(0).clone()
        src = t.to(self.device) if self.backend == "nccl" else t
        out = [torch.empty_like(src) for _ in range(self.world_size)]
        dist.all_gather(out, src.contiguous(), group=self.group)
        return torch.stack(out).to(t.device)

    def send(self, t: torch.Tensor, dst: int) -> None:
        """Send ``t`` to rank ``dst`` (which calls :meth:`recv` with a tensor of the same shape
        and dtype), point to point; returns when the send is done."""
        dist.send(t.contiguous().to(self.comm_device), dst, group=self.group)

    def recv(self, t: torch.Tensor, src: int) -> torch.Tensor:
        """Fill ``t`` with what rank ``src`` sent with :meth:`send`; returns ``t``."""
        buf = t if t.device == self.comm_device else torch.empty_like(t, device=self.comm_device)
        dist.recv(buf, src, group=self.group)
        if buf is not t:
            t.copy_(buf)
        return t

    def send_bytes(self, blob: bytes, dst: int) -> None:
        """Send ``blob`` to rank ``dst`` (which calls :meth:`recv_bytes`): its length, then
        its bytes, point to point. Returns when the send is done, also under NCCL (which
        moves device tensors only, asynchronously to the host: the device is synchronised,
        so a caller sending several blobs holds one at a time)."""
        with warnings.catch_warnings():  # a read-only view of blob, never written to
            warnings.simplefilter("ignore", UserWarning)
            data = torch.frombuffer(blob, dtype=torch.uint8) if blob else torch.empty(0, dtype=torch.uint8)
        size = torch.tensor([data.numel()], dtype=torch.int64).to(self.comm_device)
        data = data.to(self.comm_device)
        dist.send(size, dst, group=self.group)
        if data.numel():
            dist.send(data, dst, group=self.group)
        if self.backend == "nccl":
            torch.cuda.synchronize(self.device)

    def recv_bytes(self, src: int) -> bytes:
        """The bytes rank ``src`` sent with :meth:`send_bytes`."""
        dev = self.comm_device
        size = torch.zeros(1, dtype=torch.int64, device=dev)
        dist.recv(size, src, group=self.group)
        data = torch.empty(int(size.item()), dtype=torch.uint8, device=dev)
        if data.numel():
            dist.recv(data, src, group=self.group)
        return data.cpu().numpy().tobytes()

    @staticmethod
    def single(device: torch.device | str = "cpu") -> "DistContext":
        """A world of one rank (no process group)."""
        return DistContext(rank=0, world_size=1, local_rank=0, local_world_size=1,
                           device=torch.device(device), backend="none", timeout_s=0.0)


def launch_info_from_env(env: Mapping[str, str]) -> LaunchInfo | None:
    """Parse torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, ...); None when absent."""
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    try:
        world = int(env["WORLD_SIZE"])
        return LaunchInfo(rank=int(env["RANK"]), world_size=world,
                          local_rank=int(env.get("LOCAL_RANK", "0")),
                          local_world_size=int(env.get("LOCAL_WORLD_SIZE", str(world))),
                          master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
                          port=int(env.get("MASTER_PORT", "29500")), external=True,
                          restart_count=int(env.get("TORCHELASTIC_RESTART_COUNT", "0")))
    except ValueError as exc:
        raise UserError(f"bad torchrun environment: {exc}") from None


def pick_device(cfg: RuntimeConfig, local_rank: int, local_world_size: int) -> torch.device:
    """The device of a local rank: its own GPU when there is one per rank, a shared GPU
    (``local_rank mod #GPUs``) when ``device = "cuda"`` and ``backend = "gloo"`` ask for it,
    else the CPU."""
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    enough_gpus = have >= local_world_size
    if cfg.device == "cuda":
        if enough_gpus:
            return torch.device("cuda", local_rank)
        if have and cfg.backend == "gloo":  # ranks share GPUs; gloo stages device tensors through the host
            return torch.device("cuda", local_rank % have)
        if not have:
            raise UserError("runtime.device = 'cuda' but torch sees no GPU (torch.cuda.is_available() is False)")
        raise UserError(f"runtime.device = 'cuda' with {local_world_size} local ranks and {have} GPU(s): NCCL "
                        f"needs one GPU per rank; set runtime.backend = 'gloo' to let ranks share GPUs")
    if cfg.device == "auto" and enough_gpus:
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def threads_per_rank(cfg: RuntimeConfig, local_world_size: int) -> int:
    """Intra-op threads so that local ranks share the cores without oversubscribing them."""
    if cfg.threads:
        return cfg.threads
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // local_world_size)


def init_distributed(info: LaunchInfo, cfg: RuntimeConfig) -> DistContext:
    """Create the process group (if world > 1), set threads and device; return the context."""
    device = pick_device(cfg, info.local_rank, info.local_world_size)
    torch.set_num_threads(threads_per_rank(cfg, info.local_world_size))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = cfg.backend
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl" and device.type != "cuda":
        raise UserError("runtime.backend = 'nccl' needs CUDA devices; use 'gloo' on CPU")
    if info.world_size == 1:
        return DistContext(rank=0, world_size=1, local_rank=0, local_world_size=1, device=device,
                           backend="none", timeout_s=cfg.timeout_s)
    timeout = _dt.timedelta(seconds=cfg.timeout_s)
    if info.external:
        # torchrun's agent is our parent: die with it, and take SIGTERM in the watchdog
        # (blocked here, before gloo starts threads that would inherit an unblocked mask).
        # Its death sends SIGTERM, not SIGKILL: the watchdog records it in status.json, then exits.
        parent = os.getppid()
        die_with_parent(parent, signal.SIGTERM)
        block_sigterm()
        # torch's env:// rendezvous gives the store (the agent's, under torchrun). Keys of an
        # earlier attempt can stay in it (gloo then dials a dead rank's old address after an
        # elastic restart, seen here): each attempt gets its own key space.
        base, _, _ = next(dist.rendezvous("env://", timeout=timeout))
        store = dist.PrefixStore(f"commgnn/attempt{info.restart_count}/", base)
        dist.init_process_group(backend, store=dist.PrefixStore("pg/", store), rank=info.rank,
                                world_size=info.world_size, timeout=timeout)
        stale, prefix = cfg.heartbeat_timeout_s, "commgnn/"
    else:
        # Our launcher hosts the store (it outlives every rank); ranks are its clients.
        parent = info.parent_pid or info.launcher_pid
        bind_gloo_to_loopback(info.master_addr)
        store = dist.TCPStore(info.master_addr, info.port, None, False, timeout=timeout)
        stale, prefix = info.heartbeat_s, "commgnn/"
        dist.init_process_group(backend, store=dist.PrefixStore("pg/", store), rank=info.rank,
                                world_size=info.world_size, timeout=timeout)
    watchdog = Watchdog(store, info.rank, info.world_size, stale_s=stale, prefix=prefix,
                        parent_pid=parent, handle_sigterm=True).start()
    return DistContext(rank=info.rank, world_size=info.world_size, local_rank=info.local_rank,
                       local_world_size=info.local_world_size, device=device, backend=backend,
                       timeout_s=cfg.timeout_s, group=dist.group.WORLD, watchdog=watchdog,
                       split_wait=cfg.split_wait)


def loopback_interface() -> str | None:
    """The name of this host's loopback network interface (``lo`` on Linux), or None when
    it cannot be told."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    for name in names:
        try:  # IFF_LOOPBACK = 0x8 in the interface's flags
            if int(open(f"/sys/class/net/{name}/flags").read(), 16) & 0x8:
                return name
        except (OSError, ValueError):
            continue
    return next((n for n in names if n in ("lo", "lo0")), None)


def bind_gloo_to_loopback(master_addr: str) -> None:
    """Local ranks (the store on a loopback ``master_addr``): gloo's listening sockets on the
    loopback interface too. Without this gloo binds the address the host name resolves to,
    which may be a network interface. Gloo reads ``GLOO_SOCKET_IFNAME`` when a group is made
    (torch's ``init_process_group`` takes no gloo device for it), so it is set for this
    process before any group exists."""
    try:
        loopback = ipaddress.ip_address(socket.gethostbyname(master_addr)).is_loopback
    except (OSError, ValueError):
        return
    name = loopback_interface() if loopback else None
    if name is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = name


def shutdown(ctx: DistContext) -> None:
    """Leave the job together after success: a barrier first, so no rank tears its group
    down while a peer still uses it (gloo then aborts that peer). Never call it after an
    error: a barrier cannot match a peer's pending collective (just exit)."""
    if ctx.is_distributed and dist.is_initialized():
        try:
            dist.barrier(group=ctx.group)
        except dist.DistError:
            pass  # a peer is already gone; tear down regardless
        if ctx.watchdog is not None:
            ctx.watchdog.stop()
        dist.destroy_process_group()


def free_port(addr: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])


def check_port_free(addr: str, port: int) -> None:
    """Raise a UserError when ``addr:port`` cannot be bound (already in use)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((addr, port))
        except OSError:
            raise UserError(f"port {port} on {addr} is already in use; "
                            f"choose another with --port, or --port 0 to pick a free one") from None
