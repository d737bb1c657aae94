"""A diverged run stops and says so (``train.on_nonfinite``); ``metrics.jsonl`` and
``summary.json`` hold standard JSON only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from commgnn.cli.main import main
from commgnn.errors import ConfigError, Diverged
from commgnn.report.records import MetricsLog, write_json
from commgnn.trainers.config import TrainConfig
from commgnn.trainers.nonfinite import first_nonfinite, guard_step
from helpers import small_graph


def _strict(text: str) -> object:
    """Parse as standard JSON: a bare NaN or Infinity is an error."""
    def refuse(name: str) -> None:
        raise ValueError(f"non-standard JSON constant {name}")
    return json.loads(text, parse_constant=refuse)


def _graph_file(tmp_path: Path, scale: float | None = None) -> str:
    g = small_graph(n=120, m=480, f=6, c=3, seed=1)
    graph = {k: g[k] for k in ("x", "edge_index", "y", "train_mask", "val_mask", "test_mask")}
    if scale is not None:
        graph["x"] = torch.full_like(graph["x"], scale)
    path = tmp_path / "g.pt"
    torch.save(graph, path)
    return str(path)


def _config(tmp_path: Path, extra: str = "") -> str:
    path = tmp_path / "c.toml"
    path.write_text(f"[model]\nhidden = 8\n[train]\nepochs = 4\npatience = 0\n{extra}\n"
                    "[runtime]\ntimeout_s = 30\n[output]\nquiet = true\n")
    return str(path)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("parts", [1, 2])
def test_huge_features_stop_the_run_at_epoch_1_with_exit_1(tmp_path, capfd, parts):
    out = tmp_path / "run"
    code = main(["train", "--config", _config(tmp_path), "--dataset", _graph_file(tmp_path, 3e38),
                 "--parts", str(parts), "--out", str(out)])
    err = capfd.readouterr().err.strip()
    assert code == 1, err
    assert err.count("\n") == 0, err
    assert "training diverged at epoch 1: non-finite loss" in err, err
    status = _strict((out / "status.json").read_text())
    assert status["state"] == "failed" and "diverged at epoch 1" in status["error"], status
    assert not (out / "summary.json").exists() and not (out / "model.pt").exists()
    for line in (out / "metrics.jsonl").read_text().splitlines():
        _strict(line)


@pytest.mark.timeout(120)
def test_a_later_divergence_keeps_the_last_good_checkpoint(tmp_path, capfd):
    """An enormous learning rate: the first step is finite, its update is not survivable."""
    out = tmp_path / "run"
    code = main(["train", "--config", _config(tmp_path, "lr = 1e30\nweight_decay = 0\noptimizer = \"sgd\""),
                 "--dataset", _graph_file(tmp_path), "--parts", "2", "--out", str(out),
                 "--checkpoint-every", "1"])
    err = capfd.readouterr().err.strip()
    assert code == 1, err
    epoch = int(err.split("training diverged at epoch ", 1)[1].split(":", 1)[0])
    assert epoch >= 2, err
    latest = _strict((out / "checkpoints" / "latest.json").read_text())
    assert latest["epoch"] == epoch - 1  # the last good epoch's checkpoint, none for the diverged one
    rows = [_strict(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == list(range(1, epoch))
    assert all(r["loss"] is not None for r in rows)


@pytest.mark.timeout(120)
def test_skip_step_goes_on_and_logs_null_for_the_non_finite_loss(tmp_path, capfd):
    out = tmp_path / "run"
    code = main(["train", "--config", _config(tmp_path, 'on_nonfinite = "skip_step"'),
                 "--dataset", _graph_file(tmp_path, 3e38), "--parts", "2", "--out", str(out)])
    assert code == 0, capfd.readouterr().err
    rows = [_strict(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4]
    assert all(r["loss"] is None for r in rows)  # not a bare NaN
    _strict((out / "summary.json").read_text())
    # no update was applied: the weights are the initial, finite ones
    assert all(bool(torch.isfinite(v).all()) for v in torch.load(out / "model.pt", weights_only=True).values())


def test_on_nonfinite_is_validated():
    assert TrainConfig().on_nonfinite == "stop"
    with pytest.raises(ConfigError, match="on_nonfinite"):
        TrainConfig(on_nonfinite="ignore")  # type: ignore[arg-type]


def test_first_nonfinite_names_the_loss_first_then_the_first_bad_gradient():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    assert first_nonfinite(torch.tensor(1.0), model.named_parameters()) is None
    model[1].weight.grad[0, 1] = float("inf")
    model[1].bias.grad[0] = float("nan")
    assert first_nonfinite(torch.tensor(1.0), model.named_parameters()) == "gradient of '1.weight'"
    assert first_nonfinite(torch.tensor(float("nan")), model.named_parameters()).startswith("loss")
    with pytest.raises(Diverged, match="epoch 3: non-finite gradient of '1.weight' on rank 0"):
        guard_step("stop", torch.tensor(1.0), model, epoch=3, rank=0)
    assert guard_step("skip_step", torch.tensor(1.0), model, epoch=3, rank=0)
    assert all(float(p.grad.abs().sum()) == 0 for p in model.parameters())  # zeroed
    assert not guard_step("skip_step", torch.tensor(1.0), model, epoch=3, rank=0)


def test_metrics_and_json_records_write_null_for_non_finite_values(tmp_path):
    log = MetricsLog(tmp_path / "m.jsonl")
    log.write({"epoch": 1, "loss": float("nan"), "bits": [1.0, float("inf")], "x": {"y": float("-inf")}})
    log.close()
    assert _strict((tmp_path / "m.jsonl").read_text()) == {"epoch": 1, "loss": None, "bits": [1.0, None],
                                                          "x": {"y": None}}
    write_json(tmp_path / "s.json", {"loss": float("nan"), "ok": 0.5})
    assert _strict((tmp_path / "s.json").read_text()) == {"loss": None, "ok": 0.5}
