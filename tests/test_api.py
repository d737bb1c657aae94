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


class _OwnModel(torch.nn.Module):
    """A user's model: GCN and GIN layers, a residual and a LayerNorm."""

    def __init__(self, d_in: int, hidden: int, classes: int) -> None:
        from torch_geometric.nn import GCNConv, GINConv

        super().__init__()
        self.conv1 = GCNConv(d_in, hidden)
        self.conv2 = GINConv(torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.ReLU()))
        self.norm = torch.nn.LayerNorm(hidden)
        self.out = GCNConv(hidden, classes)

    def forward(self, x, edge_index):
        h = torch.relu(self.conv1(x, edge_index))
        h = self.norm(h + self.conv2(h, edge_index))
        return self.out(h, edge_index)


@pytest.mark.timeout(120)
def test_your_own_model_trains_as_it_would_in_one_process(tmp_path):
    """Exact exchange, no dropout: 2 ranks train the user's model to the same weights as
    plain single-process training (Adam, the trainer's loss and weight decay)."""
    import copy

    import torch.nn.functional as F
    from helpers import small_graph

    data = small_graph(n=150, m=600, f=6, c=3, seed=2)
    data = Data(**{k: data[k] for k in ("x", "edge_index", "y", "train_mask", "val_mask", "test_mask")})
    torch.manual_seed(0)
    model = _OwnModel(6, 8, 3)
    start = copy.deepcopy(model.state_dict())
    res = commgnn.train(data, model=model, parts=2, epochs=5, lr=0.01, patience=0, quiet=True,
                        out=tmp_path / "run")
    assert all(torch.equal(v, start[k]) for k, v in model.state_dict().items())  # the user's module is untouched
    ref = _OwnModel(6, 8, 3)
    ref.load_state_dict(start)
    opt = torch.optim.Adam(ref.parameters(), lr=0.01, weight_decay=5e-4)
    best, best_val = None, -1.0
    for _ in range(5):
        opt.zero_grad()
        F.cross_entropy(ref(data.x, data.edge_index)[data.train_mask], data.y[data.train_mask]).backward()
        opt.step()
        with torch.no_grad():
            val = (ref(data.x, data.edge_index).argmax(1) == data.y)[data.val_mask].float().mean().item()
        if val > best_val + 1e-12:
            best, best_val = copy.deepcopy(ref.state_dict()), val
    trained = torch.load(res.run_dir / "model.pt", weights_only=True)
    assert set(trained) == set(best)
    for k, v in best.items():
        assert torch.allclose(trained[k], v, atol=1e-5), k
    assert type(res.model) is _OwnModel and res.summary["model"] == "_OwnModel"


def test_an_unsupported_layer_is_refused_by_name(tmp_path):
    from torch_geometric.nn import ChebConv

    class Cheb(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = ChebConv(4, 2, K=2)

        def forward(self, x, edge_index):
            return self.conv(x, edge_index)

    with pytest.raises(ConfigError, match="ChebConv"):
        commgnn.train(model=Cheb(), parts=1, out=tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.timeout(120)
@pytest.mark.slow  # heavy on 2 cores; siblings cover the path in CI
def test_the_example_script_trains_and_loads_into_plain_pyg(tmp_path):
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "examples" / "own_model.py"
    res = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=110)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "agree on 100.0% of the nodes" in res.stdout
    acc = float(re.search(r"test accuracy ([0-9.]+)", res.stdout).group(1))
    assert acc > 0.5  # 4 classes: well above chance
