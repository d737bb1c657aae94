"""Shared test utilities: small graphs, the single-process PyG reference of the parity tests,
and running functions on several gloo ranks.

Multi-process tests use commgnn's own launcher (``spawn_ranks``) on 127.0.0.1 with a
free port; each rank writes its results to ``<tmp>/rank{r}.pt`` for the test to compare.
Functions run on ranks must live in a module (here) so spawned children can import them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.nn.functional as F
from torch_geometric.data import Data
from torch_geometric.utils import coalesce, remove_self_loops, to_undirected

from commgnn.distributed.context import DistContext, LaunchInfo, RuntimeConfig, free_port, init_distributed, shutdown
from commgnn.distributed.events import CommEvent, Hooks
from commgnn.distributed.spawn import spawn_ranks
from commgnn.models import ModelConfig, ReferenceGNN

if TYPE_CHECKING:
    from commgnn.trainers import FullGraphTrainer, TrainConfig


def bytes_by_class() -> tuple[Hooks, dict[str, int]]:
    """Hooks that add up the bytes of every collective by traffic class, and that tally."""
    hooks, sent = Hooks(), {}
    hooks.subscribe(lambda ev: isinstance(ev, CommEvent) and sent.__setitem__(ev.kind, sent.get(ev.kind, 0)
                                                                              + ev.nbytes))
    return hooks, sent


def small_graph(n: int = 60, m: int = 240, f: int = 8, c: int = 3, seed: int = 0) -> Data:
    """A random undirected graph with masks, no self loops, no duplicate edges."""
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, m), generator=g)
    ei, _ = remove_self_loops(ei)
    ei = coalesce(to_undirected(ei), num_nodes=n)
    x = torch.randn(n, f, generator=g)
    y = torch.randint(0, c, (n,), generator=g)
    perm = torch.randperm(n, generator=g)
    masks = [torch.zeros(n, dtype=torch.bool) for _ in range(3)]
    masks[0][perm[: n // 2]] = True
    masks[1][perm[n // 2: 3 * n // 4]] = True
    masks[2][perm[3 * n // 4:]] = True
    data = Data(x=x, edge_index=ei, y=y, train_mask=masks[0], val_mask=masks[1], test_mask=masks[2])
    data.num_classes_total = c
    return data


def pyg_reference(data: Data, mcfg: ModelConfig, tcfg: TrainConfig, steps: int) -> dict[str, Any]:
    """Single-process PyG in float64 on the CPU (seed 123), trained with torch's Adam, or SGD
    with ``tcfg.momentum``, as ``tcfg`` asks: the initial ``state``; step 1's ``logits``,
    ``loss`` and ``grads``; the weights after ``steps`` steps (``final``)."""
    torch.manual_seed(123)
    model = ReferenceGNN(mcfg, data.x.shape[1], data.num_classes_total).double()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    if tcfg.optimizer == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=tcfg.lr, momentum=tcfg.momentum,
                                                     weight_decay=tcfg.weight_decay)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=tcfg.lr, weight_decay=tcfg.weight_decay)
    x = data.x.double()
    out: dict[str, Any] = {"state": state}
    for step in range(steps):
        opt.zero_grad()
        logits = model(x, data.edge_index)
        loss = F.cross_entropy(logits[data.train_mask], data.y[data.train_mask])
        loss.backward()
        if step == 0:
            out.update(logits=logits.detach(), loss=loss.item(),
                       grads={n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
    out["final"] = {k: v.clone() for k, v in model.state_dict().items()}
    return out


def trainer_steps(ctx: DistContext, trainer: FullGraphTrainer, state: dict[str, torch.Tensor],
                  steps: int) -> dict[str, Any]:
    """The trainer's side of a parity test, from the reference's initial ``state``: step 1's
    ``logits``, ``loss`` (summed over ranks) and ``grads``, and the weights after ``steps``
    steps (``final``), as :func:`pyg_reference` returns them."""
    trainer.model.load_state_dict(state)
    loss, logits = trainer.compute_gradients()
    grads = {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters()}
    total = ctx.all_reduce(loss.detach().clone().reshape(1))
    trainer.optimizer.step()
    for _ in range(steps - 1):
        trainer.epoch += 1  # as the epoch loop does: levers see epochs 1, 2, ... (guard epochs)
        trainer.train_step()
    return {"logits": logits, "loss": float(total), "grads": grads,
            "final": {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}}


def _entry(info: LaunchInfo, fn: Callable[..., Any], out_dir: str, timeout_s: float, args: tuple) -> None:
    ctx = init_distributed(info, RuntimeConfig(parts=info.world_size, timeout_s=timeout_s, threads=1))
    result = fn(ctx, *args)
    torch.save(result, Path(out_dir) / f"rank{ctx.rank}.pt")
    shutdown(ctx)  # after success only: after an error the launcher ends the job


def run_on_ranks(fn: Callable[..., Any], world_size: int, tmp_path: Path, *args: Any,
                 timeout_s: float = 60.0) -> list[Any]:
    """Run ``fn(ctx, *args)`` on ``world_size`` gloo ranks; return each rank's result."""
    spawn_ranks(_entry, (fn, str(tmp_path), timeout_s, args), nprocs=world_size,
                master_addr="127.0.0.1", port=free_port())
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world_size)]
