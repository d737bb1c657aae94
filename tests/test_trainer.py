"""Trainer state: a resumed run continues exactly; early stopping respects patience."""

from __future__ import annotations

import torch

from commgnn.dist.context import DistContext
from commgnn.dist.events import Hooks
from commgnn.models import ModelConfig
from commgnn.partition import build_local_partition
from commgnn.trainers import FullGraphTrainer, TrainConfig
from helpers import small_graph


def _trainer(data, epochs: int, patience: int = 0) -> FullGraphTrainer:
    part = build_local_partition(data, torch.zeros(data.num_nodes, dtype=torch.long), 1, 0)
    return FullGraphTrainer(DistContext.single(), part, ModelConfig(name="sage", hidden=8, dropout=0.5),
                            TrainConfig(epochs=epochs, patience=patience, seed=3), Hooks())


def test_resume_from_state_dict_is_exact():
    data = small_graph()
    straight = _trainer(data, 6)
    full = [r.loss for r in straight.run()]
    first = _trainer(data, 6)
    runs = first.run()
    head = [next(runs).loss for _ in range(3)]
    state = first.state_dict()
    torch.manual_seed(999)  # disturb the global RNG: the state must restore it (dropout)
    resumed = _trainer(data, 6)
    resumed.load_state_dict(state)
    tail = [r.loss for r in resumed.run()]
    assert head + tail == full
    for (n, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), n


def test_early_stopping_stops_after_patience_epochs_without_improvement():
    data = small_graph()
    t = _trainer(data, 500, patience=5)
    vals = [r.val_acc for r in t.run()]
    assert len(vals) < 500
    best = max(range(len(vals)), key=lambda i: (vals[i], -i))
    assert len(vals) - 1 - best == 5  # stopped exactly 5 epochs after the (first) best
