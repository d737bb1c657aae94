"""FedSage+-style missing-neighbour generation (Zhang et al., NeurIPS 2021), optional.

With cross-client edges dropped, a client's nodes lose the neighbours other organisations
own. NeighGen learns, from a client's own subgraph, how many neighbours a node is missing
and what their features look like: it hides a random ``hidden_fraction`` of the client's
nodes (the *impaired* graph) and trains on the nodes left to predict, for each, the number
of its hidden neighbours and their features. The generator's parameters are trained by
FedAvg rounds across the clients, weighted by the nodes of their impaired graphs (through
the same secure sum and byte accounting as the classifier's updates). Each client then *mends* its subgraph: node ``v`` gets
``min(round(n_v), num_pred)`` generated neighbours, each a new node with generated
features and an edge to and from ``v``; the classifier trains on the mended subgraphs
(generated nodes carry no label and are never evaluated). Nothing but generator updates
leaves a client.

Per client, impaired graph ``G'`` (``n'`` nodes left, operator ``Â'``, features ``X'``):

    z    = ReLU(Â' X' W_e + b_e)                         [n', h]
    n^_v = softplus(z_v w_d + b_d)                        predicted missing degree
    f^_v = D(reshape(relu((z_v + eps) W_f + b_f), [num_pred, l]))  [num_pred, F], eps ~ N(0, s^2)
    L    = SmoothL1(n^, n) + lambda * mean over (v, j < min(n_v, num_pred)) of
           min over v's hidden neighbours u of ||f^_vj - x_u||^2 / F

with ``n_v`` the number of ``v``'s neighbours that were hidden, ``D`` a linear decoder
``l -> F`` shared by the ``num_pred`` slots (so the generator stays ``O(h num_pred l + l F)``
parameters instead of ``O(h num_pred F)``), and the feature term on a batch of
``batch_nodes`` nodes per step, its distances expanded as ``|f|^2 + |x|^2 - 2 f.x`` so that
memory is ``O(B num_pred F + P_B B num_pred)`` for the ``P_B`` hidden neighbours of the batch.

Left out from the paper: fGen's cross-client loss (other clients' nodes as targets, by
gradient exchange) and the classification loss on the mended graph inside NeighGen's
training. Mending adds ``g`` rows of ``F`` dense features to a client (``4 g F`` bytes).
Written here: no maintained library implements FedSage+ on torch.distributed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from commgnn.errors import ConfigError
from commgnn.federated.config import NeighGenConfig  # noqa: F401  (its old home)
from commgnn.federated.model import feature_operator, flat_params, gcn_operator, load_flat
from commgnn.federated.client_data import ClientData
from commgnn.models.graph import CSRPair, spmm


class NeighGen(nn.Module):
    """Encoder, degree head (dGen) and feature generator (fGen) of the module docstring."""

    def __init__(self, in_dim: int, cfg: NeighGenConfig) -> None:
        super().__init__()
        self.num_pred, self.latent, self.noise = cfg.num_pred, cfg.latent, cfg.noise
        self.w_e = nn.Parameter(torch.empty(in_dim, cfg.hidden))
        nn.init.xavier_uniform_(self.w_e)
        self.b_e = nn.Parameter(torch.zeros(cfg.hidden))
        self.degree = nn.Linear(cfg.hidden, 1)
        self.slots = nn.Linear(cfg.hidden, cfg.num_pred * cfg.latent)
        self.decode = nn.Linear(cfg.latent, in_dim)

    def encode(self, x: Tensor | CSRPair, adj: CSRPair) -> Tensor:
        """``z``: ``[n, h]``."""
        xw = spmm(x, self.w_e) if isinstance(x, CSRPair) else x @ self.w_e
        return F.relu(spmm(adj, xw) + self.b_e)

    def missing_degree(self, z: Tensor) -> Tensor:
        """``n^``: ``[n]``, non-negative."""
        return F.softplus(self.degree(z)).squeeze(-1)

    def features(self, z: Tensor, gen: torch.Generator | None = None, slot: Tensor | None = None) -> Tensor:
        """Generated neighbours' features ``[n, num_pred, F]`` (noise from ``gen`` when
        training), or only slot ``slot[i]`` of row ``i`` (``[n, F]``)."""
        if self.training and self.noise > 0:
            z = z + self.noise * torch.randn(z.shape, generator=gen)
        lat = F.relu(self.slots(z)).view(-1, self.num_pred, self.latent)
        if slot is not None:  # decode only the slots wanted: [n, F], not [n, num_pred, F]
            lat = lat[torch.arange(lat.shape[0]), slot]
        return self.decode(lat)


@dataclass
class Impaired:
    """A client's training graph for the generator: its nodes minus a hidden share."""

    x: Tensor | CSRPair
    """Features of the nodes left, ``[n', F]`` (sparse when the features are)."""
    adj: CSRPair
    """``Â'`` over the edges among the nodes left."""
    missing: Tensor
    """``n``: ``[n']`` float, each node's hidden neighbours."""
    pair_node: Tensor
    """``[P]`` int64: for each edge from a hidden node into a node left, that node (ids in ``G'``)."""
    pair_src: Tensor
    """``[P]`` int64: the hidden end of each such edge (the client's local ids)."""
    features: Tensor
    """The client's own ``[n_c, F]`` features (a reference, not a copy): ``features[pair_src]``
    are the targets."""


def impair(data: ClientData, hidden_fraction: float, gen: torch.Generator) -> Impaired:
    """Hide ``hidden_fraction`` of ``data``'s nodes (at least one node stays)."""
    n = data.num_nodes
    if n == 0:
        raise ConfigError(f"client {data.client} has no nodes: nothing to train a generator on")
    hidden = torch.rand(n, generator=gen) < hidden_fraction
    if bool(hidden.all()):
        hidden[0] = False
    keep = (~hidden).nonzero().view(-1)
    new_id = torch.full((n,), -1, dtype=torch.int64)
    new_id[keep] = torch.arange(keep.numel())
    src, dst = data.edge_index
    inside = ~hidden[src] & ~hidden[dst]
    edges = new_id[data.edge_index[:, inside]]
    into = hidden[src] & ~hidden[dst]  # an edge from a hidden node into a node left
    pair_node = new_id[dst[into]]
    missing = torch.bincount(pair_node, minlength=keep.numel()).to(torch.float32)
    return Impaired(x=feature_operator(data.x[keep]), adj=gcn_operator(edges, keep.numel()), missing=missing,
                    pair_node=pair_node, pair_src=src[into], features=data.x)


def feature_loss(generated: Tensor, nodes: Tensor, missing: Tensor, pair_node: Tensor, pair_feat: Tensor) -> Tensor:
    """Mean over ``(v, j < min(n_v, num_pred))`` of ``min_u ||generated[v, j] - x_u||^2 / F``,
    ``u`` over ``v``'s hidden neighbours. ``generated``: ``[B, num_pred, F]`` for ``nodes``
    (``[B]`` ids in the impaired graph); ``missing`` ``[n']``; ``pair_node`` ``[P]`` and
    ``pair_feat`` ``[P, F]``: each hidden neighbour's node (pairs outside ``nodes`` are
    ignored) and features."""
    b, k, f = generated.shape
    pos = torch.full((int(missing.numel()),), -1, dtype=torch.int64)
    pos[nodes] = torch.arange(b)
    sel = pos[pair_node] >= 0
    where, feats = pos[pair_node[sel]], pair_feat[sel]
    if where.numel() == 0:
        return generated.sum() * 0.0
    # ||g - x||^2 = |g|^2 + |x|^2 - 2 g.x, without a [P_b, num_pred, F] difference tensor
    cross = torch.einsum("pkf,pf->pk", generated[where], feats) if where.numel() <= b else \
        (feats @ generated.reshape(b * k, f).T).view(-1, b, k)[torch.arange(where.numel()), where]
    dist = (generated.pow(2).sum(-1)[where] + feats.pow(2).sum(-1, keepdim=True) - 2 * cross) / f  # [P_b, k]
    best = torch.full((b, k), float("inf")).scatter_reduce(0, where[:, None].expand(-1, k), dist, "amin")
    valid = torch.arange(k)[None, :] < missing[nodes].clamp(max=k)[:, None]
    return best[valid].mean() if bool(valid.any()) else generated.sum() * 0.0


def local_update(model: NeighGen, start: Tensor, data: Impaired, cfg: NeighGenConfig,
                 gen: torch.Generator) -> tuple[Tensor, float]:
    """``local_steps`` Adam steps from ``start`` (``[d_g]``) on one impaired graph; returns
    ``(w_local - start, last loss)``."""
    load_flat(model, start)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    with_missing = (data.missing > 0).nonzero().view(-1)
    loss = torch.zeros(())
    for _ in range(cfg.local_steps):
        opt.zero_grad()
        z = model.encode(data.x, data.adj)
        loss = F.smooth_l1_loss(model.missing_degree(z), data.missing)
        if with_missing.numel() and cfg.feature_weight > 0:
            pick = torch.randperm(with_missing.numel(), generator=gen)[: cfg.batch_nodes]
            nodes = with_missing[pick]
            sel = torch.isin(data.pair_node, nodes)  # only the batch's targets are gathered
            loss = loss + cfg.feature_weight * feature_loss(model.features(z[nodes], gen), nodes, data.missing,
                                                            data.pair_node[sel],
                                                            data.features[data.pair_src[sel]].to(torch.float32))
        loss.backward()
        opt.step()
    return flat_params(model) - start, float(loss.detach())


@dataclass
class Generated:
    """Neighbours generated for one client: new nodes ``n_c .. n_c + g - 1``."""

    x: Tensor
    """``[g, F]`` their features."""
    edge_index: Tensor
    """``[2, 2 g]`` each new node to its real node and back (local ids)."""

    @property
    def num_nodes(self) -> int:
        return int(self.x.shape[0])


def mend(model: NeighGen, params: Tensor, data: ClientData, x_op: Tensor | CSRPair, adj: CSRPair,
         num_pred: int) -> Generated:
    """The neighbours the trained generator ``params`` adds to ``data``'s whole subgraph
    (``x_op``, ``adj``: its features and GCN operator): ``min(round(n^_v), num_pred)`` for
    node ``v``, features clamped to the range of the client's own features."""
    load_flat(model, params)
    model.eval()
    with torch.no_grad():
        z = model.encode(x_op, adj)
        count = model.missing_degree(z).round().clamp(0, num_pred).to(torch.int64)
        owners = torch.repeat_interleave(torch.arange(data.num_nodes), count)
        slot = torch.arange(owners.numel()) - torch.repeat_interleave(torch.cumsum(count, 0) - count, count)
        feats = model.features(z[owners], slot=slot) if owners.numel() else torch.zeros(0, data.x.shape[1])
        feats = feats.clamp(float(data.x.min()), float(data.x.max())) if data.x.numel() else feats
    new = torch.arange(owners.numel()) + data.num_nodes
    return Generated(x=feats.to(torch.float32), edge_index=torch.cat([torch.stack([new, owners]),
                                                                      torch.stack([owners, new])], 1))


SumFn = Callable[[int, Mapping[int, Tensor]], Tensor]
"""``(generator round, {client: weighted update})`` -> the sum over the clients."""


def train_generator(datas: Mapping[int, ClientData], in_dim: int, cfg: NeighGenConfig, *, seed: int,
                    gens: Mapping[int, torch.Generator], summed: SumFn) -> tuple[NeighGen, Tensor, dict[str, float]]:
    """FedAvg over ``cfg.rounds``: every client updates the generator on its impaired graph;
    the updates, weighted by the client's node count, are combined by ``summed`` (the
    engine's secure or plain sum, which also counts the bytes). Returns the model, its
    trained flat parameters and a report (last mean loss, degree MAE against a constant)."""
    with torch.random.fork_rng():  # the initialisation's seed, without moving the global generator
        torch.manual_seed(seed)
        model = NeighGen(in_dim, cfg)
    params = flat_params(model)
    impaired = {c: impair(d, cfg.hidden_fraction, gens[c]) for c, d in datas.items()}
    sizes = {c: float(d.missing.numel()) for c, d in impaired.items()}
    total_size = sum(sizes.values())
    losses: list[float] = []
    for r in range(cfg.rounds):
        updates, losses = {}, []
        for c, d in impaired.items():
            delta, loss = local_update(model, params, d, cfg, gens[c])
            updates[c] = delta * (sizes[c] / total_size)
            losses.append(loss)
        params = params + summed(r, updates)
    load_flat(model, params)
    model.eval()
    with torch.no_grad():  # how well the missing degree is predicted on the impaired graphs
        err = sum(float((model.missing_degree(model.encode(d.x, d.adj)) - d.missing).abs().sum())
                  for d in impaired.values())
        mean = sum(float(d.missing.sum()) for d in impaired.values()) / total_size
        base = sum(float((d.missing - mean).abs().sum()) for d in impaired.values())
    return model, params, {"loss": sum(losses) / max(1, len(losses)), "degree_mae": err / total_size,
                           "degree_mae_constant": base / total_size}
