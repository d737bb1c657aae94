"""Users' own models for the tests, importable by name (``own_models.JKGATv2``)."""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import GATv2Conv


class JKGATv2(nn.Module):
    """A JKNet-style GATv2: both layers' outputs concatenated before the classifier. It
    keeps its constructor arguments as attributes, so a run folder can record them."""

    def __init__(self, d_in: int, hidden: int, classes: int, heads: int = 2) -> None:
        super().__init__()
        self.d_in, self.hidden, self.classes, self.heads = d_in, hidden, classes, heads
        self.conv1 = GATv2Conv(d_in, hidden, heads=heads)
        self.conv2 = GATv2Conv(hidden * heads, hidden, heads=1)
        self.out = nn.Linear(hidden * heads + hidden, classes)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        if not self.training and os.environ.get("COMMGNN_TEST_BOOM") == "1":
            raise RuntimeError("boom in the user's forward")
        h1 = F.elu(self.conv1(x, edge_index))
        h2 = F.elu(self.conv2(h1, edge_index))
        return self.out(torch.cat([h1, h2], dim=1))
