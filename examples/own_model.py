"""Train your own PyG model with commgnn, then use it in plain PyG.

Run it as a script (``python examples/own_model.py``) or cell by cell in a notebook. It
builds a model from PyG layers with its own activations, a residual and a LayerNorm,
trains it on 2 ranks with 8-bit halo messages and PowerSGD gradients, and loads the
trained weights into the same class in one process for inference.
"""

# %% A model written the way PyG users write them
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.datasets import FakeDataset
from torch_geometric.nn import GATConv, SAGEConv

import commgnn


class ResidualSAGE(nn.Module):
    def __init__(self, d_in: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.conv1 = SAGEConv(d_in, hidden)
        self.conv2 = GATConv(hidden, hidden // 2, heads=2)
        self.norm = nn.LayerNorm(hidden)
        self.conv3 = SAGEConv(hidden, classes)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.conv1(x, edge_index))
        h = self.norm(h + F.elu(self.conv2(F.dropout(h, 0.2, self.training), edge_index)))  # residual
        return self.conv3(h, edge_index)


if __name__ == "__main__":  # not for commgnn (its ranks never re-run this file): so that `from own_model import ResidualSAGE` does not train
    # %% Data: any PyG graph with x, edge_index, y (masks optional)
    data = FakeDataset(num_graphs=1, avg_num_nodes=2000, num_channels=16, num_classes=4, seed=0)[0]
    torch.manual_seed(0)
    model = ResidualSAGE(16, 32, 4)

    # %% Train partition-parallel with communication levers
    result = commgnn.train(
        data, model=model, parts=2, epochs=60, lr=0.01, quiet=True, out="runs/example-own-model",
        comm=commgnn.CommConfig(halo=commgnn.HaloConfig(bits=8),
                                grad=commgnn.GradConfig(strategy="powersgd", rank=2)))
    s = result.summary
    print(f"test accuracy {s['test_acc']:.3f}; halo {s['halo_bytes_per_epoch'] / 1e6:.2f} MB/epoch, "
          f"gradients {s['grad_bytes_per_epoch'] / 1e3:.1f} kB/epoch; records in {result.run_dir}")

    # %% Plain PyG inference with the trained weights (model.pt is the state dict of ResidualSAGE)
    plain = ResidualSAGE(16, 32, 4)
    plain.load_state_dict(torch.load(result.run_dir / "model.pt", weights_only=True))
    plain.eval()
    with torch.no_grad():
        scores = plain(data.x, data.edge_index)
    agree = (scores.argmax(1) == result.predictions.argmax(1)).float().mean().item()
    print(f"plain PyG and commgnn's predictions agree on {agree:.1%} of the nodes")
