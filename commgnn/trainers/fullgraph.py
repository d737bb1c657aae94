"""Full-graph partition-parallel training (one optimizer step per epoch on the whole graph).

Each rank computes the loss of its owned training nodes divided by the *global* number
of training nodes, so the global loss is the sum over ranks and the exact full-graph
gradient is the sum of the ranks' gradients (halo gradients travel back to their owners
inside the exchange's backward). The gradient strategy then sums over ranks.

Evaluation is always exact: an eval-mode forward with the exact exchange, and accuracy
counts summed over ranks. Training uses the halo levers of its :class:`HaloConfig`; every
``exact_every`` epochs (counting from the first) they step aside for an exact epoch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import vector_to_parameters

from commgnn import kernels
from commgnn.comm.build import build_grad_sync, build_halo
from commgnn.comm.collectives import counted_all_reduce
from commgnn.comm.config import CommConfig
from commgnn.comm.grad_sync import GradSync
from commgnn.comm.halo.alltoall import AllToAllHalo
from commgnn.comm.halo.exchange import RowExchange
from commgnn.comm.halo.maxk_rows import MaxKRows
from commgnn.comm.halo.sparse_setup import SparseSetup
from commgnn.comm.halo.protocol import HaloExchange, HaloPlan
from commgnn.data.validate import count_nonzero
from commgnn.distributed.context import DistContext
from commgnn.distributed.events import Hooks
from commgnn.errors import ConfigError
from commgnn.models.config import ModelConfig
from commgnn.models.graph import LocalGraph
from commgnn.models.byo import DistributedModel
from commgnn.models.deep import MINIBATCH_REFUSED, PRECOMPUTE_REFUSED, ResPlusGNN
from commgnn.models.net import PartitionGNN, maxk_message_layers
from commgnn.partition.local import LocalPartition
from commgnn.trainers.checkpoint import state_to_device
from commgnn.trainers.nonfinite import guard_step
from commgnn.trainers.config import TrainConfig

_DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass(frozen=True)
class EpochResult:
    """Global (summed over ranks) outcome of one epoch."""

    epoch: int
    loss: float
    train_acc: float
    val_acc: float
    test_acc: float
    time_s: float
    """This rank's wall time of the epoch (training step and evaluation)."""
    consensus: float | None = None
    """Decentralised training: mean distance of the ranks' models to their average."""


def make_optimizer(params: Iterator[nn.Parameter], cfg: TrainConfig,
                   momentum: float | None = None) -> torch.optim.Optimizer:
    """torch's Adam, or SGD with heavy-ball momentum (``cfg.momentum`` unless ``momentum``
    overrides it), as ``cfg`` asks."""
    if cfg.optimizer == "sgd":
        m = cfg.momentum if momentum is None else momentum
        return torch.optim.SGD(params, lr=cfg.lr, momentum=m, weight_decay=cfg.weight_decay)
    return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def halo_plan(part: LocalPartition) -> HaloPlan:
    return HaloPlan(send_index=part.send_index, send_counts=list(part.send_counts),
                    recv_counts=list(part.recv_counts))


def local_graph(part: LocalPartition, kernel: str = "torch") -> LocalGraph:
    if kernel == "numba":  # compiled loops use as many threads as torch's own kernels
        kernels.set_threads(torch.get_num_threads())
    return LocalGraph(num_own=part.num_owned, num_src=part.num_owned + part.num_halo,
                      edge_index=part.edge_index, in_degree=part.in_degree, kernel=kernel)


class FullGraphTrainer:
    """Trains a :class:`PartitionGNN` (or, for ``model.residual = "res+"``, a
    :class:`ResPlusGNN`) on one rank's partition; all ranks run it in lockstep."""

    def __init__(self, ctx: DistContext, part: LocalPartition, model_cfg: ModelConfig,
                 train_cfg: TrainConfig, hooks: Hooks, *, comm_cfg: CommConfig | None = None,
                 halo: HaloExchange | None = None, grad_sync: GradSync | None = None,
                 module: nn.Module | None = None, half_input: bool = False) -> None:
        """``module``: the user's own PyG model (run through :class:`DistributedModel`, with
        its own weights, equal on every rank) instead of the built-in ``model_cfg`` one.
        ``half_input``: keep half-precision features as stored (a graph folder's float16
        ``x.npy`` stays a file-backed memory map) for a caller that converts the rows it
        reads (mini-batch steps, layer-wise inference); the full-graph forward converts
        all of them when it runs."""
        self.half_input = half_input
        self.ctx, self.cfg, self.hooks = ctx, train_cfg, hooks
        comm_cfg = comm_cfg if comm_cfg is not None else CommConfig()
        self.halo_cfg = halo_cfg = comm_cfg.halo
        dtype = _DTYPES[train_cfg.dtype]
        self.part = part.to(ctx.device)
        self.dtype = dtype
        """The model's floating dtype (``train.dtype``)."""
        self.x = self._input_features(dtype)
        """``[n_own, F]`` the owned feature rows: ``dtype``, or (mini-batch) their stored dtype."""
        self._graph: LocalGraph | None = None  # built on first use (the property graph)
        plan = halo_plan(self.part)
        byo = None
        if module is None and model_cfg.residual != "none":
            # Refused before any collective is set up, identically on every rank.
            if halo_cfg.precompute:
                raise ConfigError(PRECOMPUTE_REFUSED)
            if type(self)._forward_module is not FullGraphTrainer._forward_module:  # mini-batch's block models
                raise ConfigError(MINIBATCH_REFUSED)
        if module is not None:
            if halo_cfg.precompute:
                raise ConfigError("comm.halo.precompute is not available with your own model (it needs "
                                  "commgnn's built-in first layer); drop it")
            byo = DistributedModel(module, transform_first=halo_cfg.transform_first).to(ctx.device, dtype)
        layers = byo.num_layers if byo is not None else model_cfg.layers
        sparse = (set() if byo is not None else
                  maxk_message_layers(model_cfg, part.x.shape[1], part.num_classes, halo_cfg.transform_first))
        maxk = (model_cfg.maxk_k, sparse) if sparse else None
        self.halo = halo if halo is not None else build_halo(ctx, plan, hooks, halo_cfg, num_layers=layers,
                                                             seed=train_cfg.seed, maxk=maxk)
        # Evaluation stays exact whatever lossy lever trains (MaxK's pairs are exact in fp32).
        self.eval_halo: RowExchange = AllToAllHalo(ctx, plan, hooks)
        if maxk is not None and ctx.is_distributed:
            self.eval_halo = MaxKRows(self.eval_halo, k=maxk[0], sparse_layers=sparse)
        if halo_cfg.sparse_setup:  # only the one-time halo_setup rows; evaluation passes through
            self.eval_halo = SparseSetup(self.eval_halo)
        self.grad_sync = grad_sync if grad_sync is not None else build_grad_sync(ctx, hooks, comm_cfg,
                                                                                 seed=train_cfg.seed)
        torch.manual_seed(train_cfg.seed)  # identical initial weights on every rank
        self.model: nn.Module
        if byo is not None:
            self.model = byo
            byo.setup(self.graph, self.eval_halo)  # GCNConv's global degrees: a collective, if needed
        else:
            model_cls = ResPlusGNN if model_cfg.residual == "res+" else PartitionGNN
            self.model = model_cls(model_cfg, part.x.shape[1], part.num_classes,
                                   transform_first=halo_cfg.transform_first).to(ctx.device, dtype)
            if halo_cfg.precompute:
                self.x = self.x.to(dtype)
                self.model.precompute(self.x, self.graph, self.eval_halo, dropout=halo_cfg.precompute_dropout)
            if self._sparse_input(train_cfg.sparse_input):
                self.x = self.x.to(dtype)  # the pattern's values feed the first layer as they are
                self.model.use_sparse_input(self.x, self.eval_halo)
        self.export_module: nn.Module = byo.module if byo is not None else self.model
        """The module whose state dict is the trained model (plain PyG keys)."""
        self.net = self.grad_sync.wrap(self._forward_module())  # DDP for torch's comm hooks, else the model
        # strategies that apply the momentum themselves (DGC momentum correction, QG-DSGDm)
        self.optimizer = make_optimizer(self.model.parameters(), train_cfg,
                                        momentum=0.0 if getattr(self.grad_sync, "owns_momentum", False) else None)
        self.scheduler = (torch.optim.lr_scheduler.CosineAnnealingLR(self.optimizer, T_max=train_cfg.epochs)
                          if train_cfg.schedule == "cosine" else None)
        torch.manual_seed(train_cfg.seed + 7919 * (ctx.rank + 1))  # per-rank dropout stream
        masks = torch.stack([self.part.train_mask, self.part.val_mask, self.part.test_mask])
        self.split_sizes = self._reduce(masks.sum(dim=1).to(torch.float64))
        self.epoch = 0
        self.best_val, self.since_best = -1.0, 0  # early stopping, identical on all ranks
        self.consensus: float | None = None
        self._evaluated: dict[str, torch.Tensor] | None = None
        self._skip = False  # this step's update is skipped (train.on_nonfinite = "skip_step")
        self.layerwise: Callable[[int | None], torch.Tensor] | None = None
        """When set (:class:`~commgnn.trainers.layerwise.LayerwiseInference`), evaluation and
        :meth:`predict` run it instead of the full-graph forward: ``layerwise(upto)``."""
        self.on_phase: Callable[[str, int], None] | None = None
        """Called as ``(phase, epoch)`` with ``train`` / ``eval`` at the start of each epoch's
        step and evaluation (1-based epoch): for profilers and fault injection."""

    @property
    def graph(self) -> LocalGraph:
        """The rank's :class:`LocalGraph`, built from ``part.edge_index`` on first use: a
        mini-batch rank that never runs the full-graph forward never expands a rank
        folder's in-CSR into ``edge_index`` (16 bytes an edge)."""
        if self._graph is None:
            self._graph = local_graph(self.part, self.cfg.resolved_kernel)
        return self._graph

    def _input_features(self, dtype: torch.dtype) -> torch.Tensor:
        """The owned feature rows as training holds them: converted to ``dtype``, or half
        precision kept as stored with ``half_input``."""
        x = self.part.x
        keep = self.half_input and x.dtype in (torch.float16, torch.bfloat16) and dtype in (torch.float32, torch.float64)
        return x if keep else x.to(dtype)

    def _forward_module(self) -> nn.Module:
        """The module training runs forward through (the gradient strategy may wrap it)."""
        return self.model

    def epoch_log(self) -> dict[str, Any]:
        """Per-epoch facts for ``metrics.jsonl`` beyond loss, accuracy and traffic (all
        ranks call it together: an implementation may gather over ranks)."""
        return self.halo.epoch_log()

    def _phase(self, name: str) -> None:
        if self.on_phase is not None:
            self.on_phase(name, self.epoch + 1)

    def _sparse_input(self, mode: str) -> bool:
        """Same answer on every rank (the decision changes which collectives run)."""
        if mode != "auto":
            return mode == "on"
        if not isinstance(self.x, torch.Tensor):  # rows read on use from a graph's x.npy: not scanned
            return False  # (a scan would read every row of the file; sparse_input = "on" forces it)
        nnz = torch.tensor([float(count_nonzero(self.x)), float(self.x.numel())], dtype=torch.float64)
        nnz = self.ctx.all_reduce(nnz)
        return bool(nnz[0] < 0.1 * nnz[1])

    def _reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum a small bookkeeping vector over ranks (counted as 'control' traffic)."""
        return counted_all_reduce(self.ctx, self.hooks, t, "control")

    def compute_gradients(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward, loss, backward and gradient sync, without the update.

        Returns ``(loss share of this rank, logits [n_own, C])``; afterwards every
        parameter's ``.grad`` holds the (synced) full-graph gradient.
        """
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        every = self.halo_cfg.exact_every
        self.halo.set_epoch(self.epoch, exact=bool(every) and self.epoch % every == 0)
        logits = self.net(self.x, self.graph, self.halo)
        mask = self.part.train_mask
        loss = F.cross_entropy(logits[mask], self.part.y[mask], reduction="sum") / self.split_sizes[0]
        loss.backward()
        self.halo.flush()
        # before the gradients are synced or applied: "stop" raises, "skip_step" zeroes them
        self._skip = guard_step(self.cfg.on_nonfinite, loss, self.model, epoch=self.epoch + 1, rank=self.ctx.rank,
                                any_rank=self._reduce if self.ctx.is_distributed else None)
        if self.ctx.is_distributed:
            # Time spent waiting for the slowest rank (load imbalance), kept apart from transfer.
            with self.hooks.timed("wait"):
                self.ctx.barrier()
        self.grad_sync.set_lr(self.optimizer.param_groups[0]["lr"])
        self.grad_sync.sync(self.model.parameters())
        return loss.detach(), logits.detach()

    def train_step(self) -> torch.Tensor:
        """One full-graph optimisation step; returns this rank's share of the loss."""
        loss, _ = self.compute_gradients()
        if not self._skip:  # train.on_nonfinite = "skip_step" found a non-finite loss or gradient
            self.optimizer.step()
            self.grad_sync.after_step(self.model.parameters())
        if self.scheduler is not None:
            self.scheduler.step()
        return loss

    @torch.no_grad()
    def evaluate(self) -> torch.Tensor:
        """Exact eval-mode forward; returns correct counts ``[train, val, test]`` on this rank.

        With decentralised training the ranks' models differ: the averaged model is
        evaluated (and the local one restored), and the consensus distance is recorded."""
        self.model.eval()
        local = None
        if self.grad_sync.decentralised:
            self.consensus, mean = self.grad_sync.consensus(self.model.parameters())
            local = [p.detach().clone() for p in self.model.parameters()]
            vector_to_parameters(mean, self.model.parameters())
        counts = self._correct_counts()
        self._evaluated = None
        if local is not None:
            self._evaluated = self.export_module.state_dict()  # the averaged model just evaluated
            self._evaluated = {k: v.detach().clone() for k, v in self._evaluated.items()}
            for p, v in zip(self.model.parameters(), local):
                p.copy_(v)
        return counts

    def _correct_counts(self) -> torch.Tensor:
        """``[train, val, test]`` float64 correct counts of the eval-mode model on this rank."""
        correct = self._inference().argmax(dim=1) == self.part.y
        masks = (self.part.train_mask, self.part.val_mask, self.part.test_mask)
        return torch.stack([(correct & m).sum() for m in masks]).to(torch.float64)

    def _inference(self, upto: int | None = None, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The eval-mode forward over every owned node (``upto = k``: layer k's output),
        with the exact exchange (or :attr:`layerwise`); all ranks call it together.
        ``rows``: only those owned rows' outputs (layer-wise computes their receptive field
        alone; the full-graph forward is indexed)."""
        if self.layerwise is not None:
            return self.layerwise(upto, rows)
        out = self.model(self.x.to(self.dtype), self.graph, self.eval_halo, **({} if upto is None else {"upto": upto}))
        return out if rows is None else out[rows]

    def evaluated_state(self) -> dict[str, torch.Tensor]:
        """A CPU copy of the weights the last :meth:`evaluate` scored: the ranks' average
        under decentralised training, else this rank's model (equal on every rank)."""
        state = self._evaluated if self._evaluated is not None else self.export_module.state_dict()
        return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}

    @torch.no_grad()
    def predict(self, state: dict[str, torch.Tensor] | None = None, *, layer: int | None = None,
                rows: torch.Tensor | None = None) -> torch.Tensor:
        """``[n_own, C]`` class scores (logits) of this rank's nodes, exact exchange, eval
        mode, with ``state`` loaded for the pass (the current weights when None); with
        ``layer = k`` the output of layer k instead (embeddings); with ``rows [m]`` (sorted
        owned rows) ``[m, C]``, those rows' alone. All ranks call it together."""
        saved = None
        if state is not None:
            saved = {k: v.detach().clone() for k, v in self.export_module.state_dict().items()}
            self.export_module.load_state_dict(state)
        self.model.eval()
        logits = self._inference(layer, rows)
        if saved is not None:
            self.export_module.load_state_dict(saved)
        return logits

    def step(self) -> EpochResult:
        """Train one epoch and evaluate; all ranks must call it together."""
        t0 = time.perf_counter()
        self._phase("train")
        loss = self.train_step()
        self._phase("eval")
        counts = self.evaluate()
        stats = self._reduce(torch.cat([loss.to(torch.float64).reshape(1), counts]))
        accs = (stats[1:] / self.split_sizes.clamp(min=1)).tolist()
        self.epoch += 1
        return EpochResult(self.epoch, float(stats[0]), accs[0], accs[1], accs[2],
                           time.perf_counter() - t0, self.consensus)

    def run(self) -> Iterator[EpochResult]:
        """Epochs until ``epochs`` or early stopping (decided identically on every rank)."""
        while self.epoch < self.cfg.epochs:
            if self.cfg.patience and self.since_best >= self.cfg.patience:
                break
            res = self.step()
            if res.val_acc > self.best_val:
                self.best_val, self.since_best = res.val_acc, 0
            else:
                self.since_best += 1
            yield res

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "best_val": self.best_val, "since_best": self.since_best,
                "rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state() if self.ctx.device.type == "cuda" else None,
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(), "halo": self.halo.state_dict(),
                "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
                "grad_sync": self.grad_sync.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.best_val, self.since_best = state["epoch"], state["best_val"], state["since_best"]
        torch.set_rng_state(state["rng"])
        if state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(state["cuda_rng"])
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        # the levers' state back where its tensors live (checkpoints load onto the CPU)
        self.halo.load_state_dict(state_to_device(state["halo"], self.ctx.device))
        self.grad_sync.load_state_dict(state_to_device(state["grad_sync"], self.ctx.device))
