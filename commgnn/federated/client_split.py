"""Split one graph into federated clients: which client owns each node.

The graph is the data layer's PyG :class:`~torch_geometric.data.Data` (what
:func:`commgnn.data.load_dataset` returns): ``x`` ``[N, F]``, ``edge_index`` ``[2, E]``
(``edge_index[0]`` = source, ``[1]`` = target, PyG's message direction), ``y`` ``[N]``
(``-1`` = unlabelled) and 1-D bool ``train_mask`` / ``val_mask`` / ``test_mask`` (absent
masks count as all-False). An assignment ("owner") is a ``[N]`` int64 tensor of client
ids in ``0..K-1``, every client non-empty.

Methods of :func:`split_clients`:

* ``louvain``: :func:`networkx.community.louvain_communities` on the undirected graph,
  then communities dealt to clients as FederatedScope-GNN's Louvain splitter does:
  communities larger than ``ceil(N / K)`` are first cut into near-equal pieces (along a
  BFS order, so pieces stay connected where they can), then pieces go, largest first, to
  the client holding the fewest nodes. If there are still fewer pieces than clients, the
  largest piece is halved until there are enough. A client thus ends up with at most
  ``2 * ceil(N / K)`` nodes (the greedy's bound), usually close to ``N / K``.
* ``metis``: ``K``-way METIS through the project's wrapper
  (:func:`commgnn.partition.assign_parts` with ``method="metis"``).
* ``dirichlet``: label skew, the NIID-Bench recipe (Li et al., 2022) that OpenFGL and
  most FL papers use: per class, client shares ``p ~ Dir(alpha)``, with clients already
  holding ``N / K`` nodes given share 0; the class's nodes, shuffled, are cut at
  ``cumsum(p)``. Small ``alpha`` = strong skew. A draw is kept when every client holds at
  least ``min(10, N // K)`` nodes (the recipe redraws below 10); after
  :data:`DIRICHLET_TRIES` failed draws the draw with the largest smallest client is kept
  and nodes are moved, at random, from the largest clients into the small ones until
  each has that minimum. Unlabelled nodes (``y < 0``) go to uniformly random clients.
* ``file``: a user file mapping nodes to clients: ``.npy`` / ``.pt`` holding ``[N]``
  integer client ids, or ``.csv`` with one ``node,client`` row per node (a header row is
  allowed). Client ids must be ``0..K-1`` without gaps.

Each client's data is then built by :mod:`commgnn.federated.client_data`.
"""

from __future__ import annotations

import heapq
import math
from typing import Any, get_args

import networkx as nx
import numpy as np
import torch
from torch import Tensor

from commgnn.config import one_line_errors, positive
from commgnn.errors import ConfigError
from commgnn.federated.client_data import graph_edge_index, graph_labels, graph_num_nodes
from commgnn.federated.client_map_file import load_client_map
from commgnn.federated.communities import louvain_communities
from commgnn.federated.config import SplitConfig, SplitMethod

DIRICHLET_TRIES = 100
"""Draws of the Dirichlet split before falling back to moving nodes into small clients."""

_DIRICHLET_MIN = 10  # the recipe's minimum client size (capped at N // K on tiny graphs)


@one_line_errors
def split_clients(graph: Any, n_clients: int, method: SplitMethod, *, seed: int,
                  alpha: float = 0.5, path: str | None = None) -> Tensor:
    """``[N]`` int64 client ids in ``0..n_clients-1``, every client non-empty.

    ``graph`` is a PyG ``Data`` with ``edge_index`` (and ``y`` for ``dirichlet``); see the
    module docstring for the methods. Deterministic in ``seed``.

    Raises:
        ConfigError: unknown method, ``n_clients`` outside ``[1, N]``, ``alpha <= 0``,
            ``file`` without a path, or a file naming another number of clients.
        DataError: an unreadable or inconsistent client map file (one line each).
        PartitionError: METIS left a client empty.
    """
    n = graph_num_nodes(graph)
    if isinstance(n_clients, bool) or not isinstance(n_clients, int) or n_clients < 1:
        raise ConfigError(f"clients must be a positive int, got {n_clients!r:.40}")
    if n_clients > n:
        raise ConfigError(f"cannot split {n} nodes into {n_clients} clients; lower clients")
    edge_index = graph_edge_index(graph, n)
    if method == "louvain":
        owner = _louvain(edge_index, n, n_clients, seed)
    elif method == "metis":
        from commgnn.partition.api import assign_parts
        from commgnn.partition.config import PartitionConfig

        owner = assign_parts(edge_index, n, n_clients, PartitionConfig(method="metis", seed=seed))
    elif method == "dirichlet":
        positive("alpha", alpha)
        owner = _dirichlet(graph_labels(graph, n), n, n_clients, float(alpha), seed)
    elif method == "file":
        if path is None:
            raise ConfigError("method 'file' needs path = a .npy, .pt or .csv client map")
        owner = load_client_map(path, n, n_clients)
    else:
        choices = ", ".join(repr(m) for m in get_args(SplitMethod))
        raise ConfigError(f"split method {method!r} is not one of {choices}")
    sizes = torch.bincount(owner, minlength=n_clients)
    # Every method guarantees this; a violation is a bug here, not a user error.
    assert owner.shape == (n,) and sizes.numel() == n_clients and bool((sizes > 0).all())
    return owner


def split_from_config(graph: Any, cfg: SplitConfig) -> Tensor:
    """:func:`split_clients` with the settings of ``cfg``."""
    return split_clients(graph, cfg.clients, cfg.method, seed=cfg.seed, alpha=cfg.alpha,
                         path=cfg.path)


# --------------------------------------------------------------------------- louvain


def _louvain(edge_index: Tensor, n: int, k: int, seed: int) -> Tensor:
    graph = nx.Graph()
    graph.add_nodes_from(range(n))  # isolated nodes too: each is its own community
    src, dst = edge_index
    keep = src != dst
    graph.add_edges_from(zip(src[keep].tolist(), dst[keep].tolist()))
    communities = louvain_communities(graph, edge_index, n, seed)
    # FS-G caps communities near N / K before dealing them out: one giant community
    # would otherwise make one giant client.
    cap = math.ceil(n / k)
    pieces: list[list[int]] = []
    for community in communities:
        nodes = sorted(community)
        if len(nodes) <= cap:
            pieces.append(nodes)
        else:
            order = _bfs_order(graph, nodes)
            pieces.extend(chunk.tolist() for chunk in np.array_split(order, math.ceil(len(nodes) / cap)))
    while len(pieces) < k:  # fewer communities than clients: halve the largest
        largest = max(range(len(pieces)), key=lambda i: (len(pieces[i]), -pieces[i][0]))
        order = _bfs_order(graph, pieces.pop(largest))
        half = len(order) // 2
        pieces.extend([order[:half].tolist(), order[half:].tolist()])
    # Greedy (LPT): largest piece to the currently smallest client; ties by lowest id
    # (pieces by their smallest node), so the result depends on the seed alone.
    pieces.sort(key=lambda p: (-len(p), min(p)))
    heap = [(0, c) for c in range(k)]
    nodes_flat: list[int] = []
    clients_flat: list[int] = []
    for piece in pieces:
        size, c = heapq.heappop(heap)
        nodes_flat.extend(piece)
        clients_flat.extend([c] * len(piece))
        heapq.heappush(heap, (size + len(piece), c))
    owner = torch.empty(n, dtype=torch.int64)
    owner[torch.tensor(nodes_flat, dtype=torch.int64)] = torch.tensor(clients_flat, dtype=torch.int64)
    return owner


def _bfs_order(graph: nx.Graph, nodes: list[int]) -> np.ndarray:
    """``nodes`` in breadth-first order (component by component, each from its smallest
    node), so consecutive chunks of it are mostly connected."""
    sub = graph.subgraph(nodes)
    order: list[int] = []
    for component in sorted(nx.connected_components(sub), key=min):
        start = min(component)
        order.append(start)
        order.extend(v for _, v in nx.bfs_edges(sub, start))
    return np.asarray(order, dtype=np.int64)


# ------------------------------------------------------------------------- dirichlet


def _dirichlet(y: Tensor, n: int, k: int, alpha: float, seed: int) -> Tensor:
    rng = np.random.default_rng(seed)
    y_np = y.numpy()
    # Nodes grouped by class once (stable sort), so each draw only permutes the groups.
    by_class = np.argsort(y_np, kind="stable")
    classes, counts = np.unique(y_np, return_counts=True)
    groups = dict(zip(classes.tolist(), np.split(by_class, np.cumsum(counts)[:-1])))
    negative = [c for c in groups if c < 0]  # y < 0: unlabelled, no class to skew by
    unlabelled = np.concatenate([groups.pop(c) for c in negative]) if negative else None
    need = min(_DIRICHLET_MIN, n // k)
    best: np.ndarray | None = None
    best_min = -1
    for _ in range(DIRICHLET_TRIES):
        owner = _dirichlet_draw(groups, unlabelled, n, k, alpha, rng)
        smallest = int(np.bincount(owner, minlength=k).min())
        if smallest >= need:
            return torch.from_numpy(owner)
        if smallest > best_min:
            best, best_min = owner, smallest
    assert best is not None
    return torch.from_numpy(_fill_small(best, k, need, rng))


def _dirichlet_draw(groups: dict[int, np.ndarray], unlabelled: np.ndarray | None, n: int,
                    k: int, alpha: float, rng: np.random.Generator) -> np.ndarray:
    owner = np.empty(n, dtype=np.int64)
    sizes = np.zeros(k, dtype=np.int64)
    for idx in groups.values():
        idx = rng.permutation(idx)
        p = rng.dirichlet(np.full(k, alpha))
        p[sizes >= n / k] = 0.0  # the recipe's balance term: full clients take no more
        total = p.sum()
        if not np.isfinite(total) or total <= 0:  # all mass on full clients (tiny alpha)
            p = (sizes < n / k).astype(np.float64)
            total = p.sum()
        cuts = np.clip((np.cumsum(p / total) * idx.size).astype(np.int64)[:-1], 0, idx.size)
        take = np.diff(np.concatenate([[0], cuts, [idx.size]]))
        owner[idx] = np.repeat(np.arange(k), take)
        sizes += take
    if unlabelled is not None and unlabelled.size:
        owner[unlabelled] = rng.integers(k, size=unlabelled.size)
    return owner


def _fill_small(owner: np.ndarray, k: int, need: int, rng: np.random.Generator) -> np.ndarray:
    """Move random nodes from the largest clients into those below ``need`` nodes."""
    owner = owner.copy()
    sizes = np.bincount(owner, minlength=k)
    for c in np.flatnonzero(sizes < need).tolist():
        while sizes[c] < need:
            donor = int(np.argmax(sizes))
            moved = min(need - int(sizes[c]), int(sizes[donor]) - need)
            pick = rng.choice(np.flatnonzero(owner == donor), size=moved, replace=False)
            owner[pick] = c
            sizes[donor] -= moved
            sizes[c] += moved
    return owner
