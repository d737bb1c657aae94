"""Trainer state: a resumed run continues exactly; early stopping respects patience."""

from __future__ import annotations

import pytest
import torch

from commgnn.distributed.context import DistContext
from commgnn.distributed.events import Hooks
from commgnn.models import ModelConfig
from commgnn.partition import build_local_partition
from commgnn.trainers import FullGraphTrainer, TrainConfig
from helpers import small_graph


def _trainer(data, epochs: int, patience: int = 0, **train) -> FullGraphTrainer:
    part = build_local_partition(data, torch.zeros(data.num_nodes, dtype=torch.long), 1, 0)
    return FullGraphTrainer(DistContext.single(), part, ModelConfig(name="sage", hidden=8, dropout=0.5),
                            TrainConfig(epochs=epochs, patience=patience, seed=3, **train), Hooks())


@pytest.mark.parametrize("train", [{}, {"optimizer": "sgd", "schedule": "cosine", "lr": 0.1}])
def test_resume_from_state_dict_is_exact(train):
    data = small_graph()
    straight = _trainer(data, 6, **train)
    full = [r.loss for r in straight.run()]
    first = _trainer(data, 6, **train)
    runs = first.run()
    head = [next(runs).loss for _ in range(3)]
    state = first.state_dict()
    torch.manual_seed(999)  # disturb the global RNG: the state must restore it (dropout)
    resumed = _trainer(data, 6, **train)
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


def test_sgd_with_cosine_schedule_decays_the_learning_rate_to_zero():
    t = _trainer(small_graph(), 8, optimizer="sgd", schedule="cosine", lr=0.1, momentum=0.5)
    assert isinstance(t.optimizer, torch.optim.SGD) and t.optimizer.param_groups[0]["momentum"] == 0.5
    lrs = []
    for _ in t.run():
        lrs.append(t.optimizer.param_groups[0]["lr"])
    assert all(a > b for a, b in zip(lrs, lrs[1:])) and lrs[-1] == pytest.approx(0.0, abs=1e-12)
    assert isinstance(_trainer(small_graph(), 2).optimizer, torch.optim.Adam)


def test_train_config_errors_name_the_key():
    from commgnn.errors import ConfigError

    with pytest.raises(ConfigError, match="train.momentum"):
        TrainConfig(momentum=1.0)
    with pytest.raises(ConfigError, match="train.optimizer must be 'adam' or 'sgd'"):
        TrainConfig(optimizer="lamb")  # type: ignore[arg-type]
