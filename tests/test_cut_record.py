"""A record cut short by a full disk (``metrics.jsonl`` ends mid-record): ``--resume`` says
so in one line and continues from the whole records before it, as if the record had been
whole (one rank, in this process)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from commgnn.cli.main import main

CONFIG = """
[data.synthetic]
num_nodes = 200
num_classes = 3
feature_dim = 6
[model]
hidden = 4
layers = 1
[train]
epochs = 5
patience = 0
[runtime]
checkpoint_every = 2
threads = 1
[output]
quiet = true
"""


def _rows(run: Path) -> list[tuple]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["epoch"], r["loss"], r["train_acc"], r["val_acc"], r["test_acc"]) for r in rows]


def test_resume_after_a_cut_record_warns_and_uses_the_records_before_it(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text(CONFIG)
    run = tmp_path / "run"
    assert main(["train", "--config", str(cfg), "--parts", "1", "--out", str(run)]) == 0
    ckpt = json.loads((run / "checkpoints" / "latest.json").read_text())["epoch"]
    text = (run / "metrics.jsonl").read_text()
    lines = text.splitlines()
    assert len(lines) == 5 and ckpt < 5  # the last record is newer than the checkpoint
    intact = tmp_path / "intact"
    shutil.copytree(run, intact)
    assert main(["train", "--resume", str(intact), "--epochs", "7"]) == 0
    capsys.readouterr()

    (run / "metrics.jsonl").write_text(text[: len(text) - 1 - len(lines[-1]) // 2])  # epoch 5 cut mid-record
    assert main(["train", "--resume", str(run), "--epochs", "7"]) == 0
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("commgnn: warning: "), err
    assert "the last record (line 5, epoch 5) was cut short" in err[0]
    # the records before the cut one were kept, the cut one dropped, training went on from
    # the checkpoint: the same rows as the resume of the intact folder, each epoch once
    assert _rows(run) == _rows(intact)
    assert [r[0] for r in _rows(run)] == list(range(1, 8))
    assert json.loads((run / "status.json").read_text())["state"] == "complete"
