"""VR-GCN's forward pass over a :class:`~commgnn.sampling.vrgcn.VRBatch`, and its history,
with the paper's control variate for dropout (CVD; Chen, Zhu and Song, ICML 2018, sec. 4.2).

Two streams run through the layers: ``h`` with dropout (the training signal) and ``mu``
without (its mean, as dropout is scaled to keep the expectation). With ``hbar_l: [N, d_l]``
the history of layer l's *no-dropout* input (l >= 1) on this rank, ``A`` the block's
sampled mean (``1/k_v`` per sampled edge), ``A_full`` all in-edges (``1/d_v``) and ``s_v``
the noise scale below::

    h_1  = act(W_l pre[:n] + b_l + W_r dropout(x[:n]))     layer 0: the exact mean, precomputed
    mu_1 = act(W_l pre[:n] + b_l + W_r x[:n])
    c     = A (mu_l - hbar_l[nodes]) + A_full hbar_l[all in-neighbours]        [num_dst_l, d_l]
    agg   = s * A (dropout(h_l) - mu_l) + c
    h_{l+1}  = act(W_l agg + b_l + W_r dropout(h_l)[:num_dst_l])
    mu_{l+1} = act(W_l c   + b_l + W_r mu_l[:num_dst_l])                       (only for l+1 < L)
    hbar_l[nodes[:num_src_l]] <- mu_l   (after the step, detached)

``c`` is VR-GCN's control variate on the mean: its expectation over the sample is
``A_full mu`` whatever ``hbar`` is, and its variance vanishes as ``hbar -> mu``. The
dropout noise ``dropout(h) - mu`` has mean 0 (so ``agg`` keeps the expectation) and is
independent across neighbours, variance ``sigma^2`` each: the exact aggregate's is
``sigma^2 / d_v``, a mean over k distinct sampled neighbours has ``sigma^2 / k_v``, and
over k draws with replacement (repeats share their noise) ``sigma^2 (d_v + k_v - 1) /
(k_v d_v)``. ``s_v = sqrt(k_v / d_v)``, resp. ``sqrt(k_v / (d_v + k_v - 1))``, scales it back
to the exact variance (``s_v = 1`` where every neighbour is taken without replacement, and
``agg`` is then the exact aggregate). Without that split (the history holding dropped-out
activations, the noise averaged over k), VR-GCN at a small fan-out trains well below full
batch (the docs' mini-batch results page has the measurement). Without dropout (or in evaluation) the two
streams are one and ``agg = c``.

Layer 0's aggregate ``pre = mean_N x`` takes no dropout. Full-batch training drops each
neighbour's input entries before the mean, which leaves the mean's noise ~``1/d_v`` of
one row's; dropping ``pre`` itself puts a whole row's noise on it (``d_v`` times too much
on a dense graph), and the exact noise would need the neighbours' rows, which the
precomputation exists to avoid. So the mean stays noise-free (the large-degree limit)
and the root term ``x`` keeps its dropout (both choices are compared on the docs'
mini-batch results page).

``W_l`` is applied after the aggregation (the mean is linear, and no row of a layer >= 1
is exchanged: the history is local), so it receives the history term's gradient; the
history itself carries none, as in the paper. Each rank keeps the history of every node
it computes (its own and remote ones); rows it never computed are 0, which only weakens
the control variate until they are first computed.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from commgnn.models.blocks import BlockGraph
from commgnn.models.dropout import dropout
from commgnn.models.graph import CSRPair, spmm
from commgnn.models.net import PartitionGNN
from commgnn.sampling.base import Block
from commgnn.sampling.vrgcn import HistoryEdges, VRBatch


class History:
    """``hbar_l`` for l = 1 .. L-1: ``[N, d_l]`` tables."""

    def __init__(self, num_nodes: int, widths: list[int], dtype: torch.dtype) -> None:
        self.tables = [torch.zeros(num_nodes, w, dtype=dtype) for w in widths]

    def __getitem__(self, layer: int) -> Tensor:
        return self.tables[layer - 1]

    def state_dict(self) -> dict[str, Any]:
        return {"tables": [t.clone() for t in self.tables]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for t, s in zip(self.tables, state["tables"]):
            t.copy_(s)


class VRGCN(nn.Module):
    """``forward(rows, batch)``: rows are ``[n0, 2F]`` = ``[x | mean_N x]`` of ``batch.nodes``."""

    def __init__(self, model: PartitionGNN, history: History, replace: bool = False) -> None:
        """``replace``: the sampler draws neighbours with replacement (sets the noise scale)."""
        super().__init__()
        self.gnn = model
        self.history = history
        self.replace = replace

    def forward(self, rows: Tensor, batch: VRBatch) -> Tensor:
        gnn = self.gnn
        p, training = gnn.cfg.dropout, self.training
        noisy = training and p > 0  # two streams only when dropout draws noise
        half = rows.shape[1] // 2
        x, pre = rows[:, :half], rows[:, half:]
        n1 = batch.blocks[0].num_dst
        conv0 = gnn.convs[0]
        h = conv0.from_precomputed(pre[:n1], dropout(x[:n1], p, training), None)
        mu = conv0.from_precomputed(pre[:n1], x[:n1], None) if noisy else h
        last = len(gnn.convs) - 1
        if last > 0:
            h = gnn.post(0, h)
            mu = gnn.post(0, mu) if noisy else h
        updates: list[tuple[Tensor, Tensor, Tensor]] = []
        for i in range(1, last + 1):
            conv, block, full = gnn.convs[i], batch.blocks[i], batch.history_edges[i]
            assert full is not None
            table = self.history[i]
            ids = batch.nodes[: block.num_src]
            mean = BlockGraph(block).mean_adj(h.dtype)
            c = control_variate(mean, full, table, ids, mu)  # the history before this step
            updates.append((table, ids, mu.detach()))
            hd = dropout(h, p, training)
            agg = c + dropout_noise(mean, block, full, hd, mu, self.replace) if noisy else c
            h = _sage_out(conv, agg, hd[: block.num_dst])
            if i < last:
                h = gnn.post(i, h)
                mu = gnn.post(i, _sage_out(conv, c, mu[: block.num_dst])) if noisy else h
        if training:
            for table, ids, value in updates:  # hbar_i <- mu_i for the rows this step computed
                table[ids] = value.to(table.dtype)
        return h


def control_variate(mean: CSRPair, full: HistoryEdges, table: Tensor, ids: Tensor, mu: Tensor) -> Tensor:
    """``c = A (mu - hbar[ids]) + A_full hbar``: ``[num_dst, d]`` from ``mu: [num_src, d]``,
    ``mean`` the block's ``A`` and ``table`` the layer's history ``[N, d]``."""
    with torch.no_grad():  # the history is a constant: no gradient flows into it
        old = table[ids].to(mu.dtype)
        agg_full = torch.zeros(mean.a.shape[0], mu.shape[1], dtype=mu.dtype)
        agg_full.index_add_(0, full.dst, table[full.src].to(mu.dtype) * full.weight.to(mu.dtype)[:, None])
    return spmm(mean, mu - old) + agg_full


def dropout_noise(mean: CSRPair, block: Block, full: HistoryEdges, hd: Tensor, mu: Tensor,
                  replace: bool = False) -> Tensor:
    """``s * A (hd - mu)``: the sampled dropout noise scaled to the exact aggregate's
    variance (module docstring), from k_v sampled edges (draws) and d_v in-edges of each
    destination v; 0 where v has none."""
    k = torch.bincount(block.edge_index[1], minlength=block.num_dst).to(hd.dtype)
    d = torch.bincount(full.dst, minlength=block.num_dst).to(hd.dtype)
    spread = d + k - 1 if replace else d
    scale = (k / spread.clamp(min=1)).sqrt()[:, None]
    return scale * spmm(mean, hd - mu)


def _sage_out(conv: nn.Module, agg: Tensor, h_dst: Tensor) -> Tensor:
    """``W_l agg + b_l + W_r h_dst`` (GraphSAGE-mean on an aggregate of input rows)."""
    return conv.lin_l(agg) + conv.lin_r(h_dst)
