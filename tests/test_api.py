"""The Python API: a user's PyG graph in, the trained model and predictions out.

The README's API example is run here verbatim (extracted from README.md), so the
documentation cannot drift from the code.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch_geometric.data import Data

import commgnn
from commgnn.errors import ConfigError, DataError, UserError

README = Path(__file__).resolve().parents[1] / "README.md"


def _readme_block(marker: str) -> str:
    """The ```python block of README.md that contains ``marker``."""
    for block in re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S):
        if marker in block:
            return block
    raise AssertionError(f"no python block with {marker!r} in README.md")


@pytest.mark.timeout(120)
def test_the_readme_api_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(_readme_block("commgnn.train("), "README.md", "exec"), scope)
    result = scope["result"]
    assert isinstance(result, commgnn.TrainResult)
    assert result.summary["parts"] == 2 and result.predictions.dim() == 2


@pytest.mark.timeout(120)
def test_trained_model_and_predictions_load_into_plain_pyg(tmp_path):
    from helpers import small_graph
    from torch_geometric.nn import SAGEConv

    data = small_graph(n=120, m=500, f=6, c=3, seed=1)
    data = Data(x=data.x, edge_index=data.edge_index, y=data.y, train_mask=data.train_mask,
                val_mask=data.val_mask, test_mask=data.test_mask)
    res = commgnn.train(data, model="sage", parts=2, epochs=15, hidden=8, quiet=True, out=tmp_path / "run",
                        embeddings_layer=0, comm=commgnn.CommConfig(halo=commgnn.HaloConfig(bits=8)))
    assert res.predictions.shape == (120, 3)
    # model.pt is the state dict of the same model built in plain PyG ...
    state = torch.load(res.run_dir / "model.pt", weights_only=True)
    assert all(isinstance(m, SAGEConv) for m in res.model.convs)
    assert set(state) == set(res.model.state_dict())
    # ... and the predictions are that model's scores, in the graph's own node order
    with torch.no_grad():
        scores = res.model(data.x, data.edge_index)
        emb = torch.relu(res.model.convs[0](data.x, data.edge_index))  # layer 0's output
    assert torch.allclose(scores, res.predictions, atol=1e-5)
    assert torch.allclose(emb, torch.load(res.run_dir / "embeddings.pt"), atol=1e-5)
    acc = (scores.argmax(1) == data.y)[data.test_mask].float().mean().item()
    assert acc == pytest.approx(res.summary["test_acc"], abs=1e-6)


def test_options_are_the_cli_flags_and_errors_are_typed(tmp_path):
    with pytest.raises(ConfigError, match="unknown option 'epoch'"):
        commgnn.train(epoch=3)
    with pytest.raises(ConfigError, match="model.hidden must be > 0"):
        commgnn.train(hidden=0)
    bad = Data(x=torch.randn(5, 2), edge_index=torch.tensor([[0, 9], [1, 2]]), y=torch.zeros(5, dtype=torch.long))
    with pytest.raises(DataError, match="edge_index has node id 9"):
        commgnn.train(bad, parts=1, out=tmp_path / "x")
    assert not (tmp_path / "x").exists()
    with pytest.raises(UserError, match="no finished run"):
        commgnn.load_result(tmp_path)


@pytest.mark.timeout(120)
def test_predict_reproduces_the_runs_predictions_on_other_rank_counts(tmp_path, capsys):
    from commgnn.cli.main import main

    run = tmp_path / "run"
    assert main(["train", "--parts", "2", "--epochs", "3", "--hidden", "8", "--quiet", "--out", str(run),
                 "--config", str(_small_synthetic(tmp_path))]) == 0
    for parts in ("1", "3"):
        out = tmp_path / f"p{parts}.pt"
        assert main(["predict", str(run), "--parts", parts, "--out", str(out)]) == 0
        assert torch.allclose(torch.load(out), torch.load(run / "predictions.pt"), atol=1e-5)
    assert main(["predict", str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def _small_synthetic(tmp_path: Path) -> Path:
    path = tmp_path / "small.toml"
    path.write_text("[data.synthetic]\nnum_nodes = 500\nnum_classes = 3\nfeature_dim = 8\n")
    return path
