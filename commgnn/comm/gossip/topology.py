"""Communication topologies for decentralised training.

A topology answers, for round t, whom each rank sends to and with what weights:
``mixing(t) -> W`` with ``W[i, j]`` the weight rank i gives to the value of rank j
(row-stochastic; for D-PSGD also column-stochastic). Graph topologies are static and use
Metropolis-Hastings weights ``W_ij = 1 / (1 + max(deg_i, deg_j))`` (doubly stochastic on
any undirected graph); the one-peer exponential graph changes each round: in round t rank
i averages with rank ``i - 2^(t mod log2 P)``, so after log2 P rounds (P a power of two)
every rank holds the exact average.
"""

from __future__ import annotations

import math
from pathlib import Path

import networkx as nx
import torch
from torch import Tensor

from commgnn.config import one_line_errors
from commgnn.errors import ConfigError

NAMED = ("ring", "torus", "exponential", "full")


def _metropolis(g: nx.Graph, n: int) -> Tensor:
    W = torch.zeros(n, n, dtype=torch.float64)
    deg = dict(g.degree())
    for i, j in g.edges():
        if i != j:
            W[i, j] = W[j, i] = 1.0 / (1 + max(deg[i], deg[j]))
    W += torch.diag(1.0 - W.sum(dim=1))
    return W


@one_line_errors
def graph_for(name: str, n: int) -> nx.Graph | None:
    """The static graph of a named topology (None for the time-varying exponential)."""
    if name == "ring":
        return nx.cycle_graph(n) if n > 2 else nx.complete_graph(n)
    if name == "full":
        return nx.complete_graph(n)
    if name == "torus":
        rows = int(math.isqrt(n))
        while n % rows:
            rows -= 1
        g = nx.grid_2d_graph(rows, n // rows, periodic=(rows > 2, n // rows > 2))
        return nx.convert_node_labels_to_integers(g, ordering="sorted")
    if name == "exponential":
        return None
    path = Path(name)
    if not path.exists():
        raise ConfigError(f"comm.gossip.topology: {name!r} is neither one of {', '.join(NAMED)} "
                          f"nor an existing graph file")
    try:
        g = nx.read_edgelist(path, nodetype=int) if path.suffix in (".txt", ".edgelist", "") \
            else nx.read_graphml(path, node_type=int) if path.suffix == ".graphml" else nx.read_gml(path, label="id")
    except Exception as exc:  # networkx raises many kinds for malformed files
        why = " ".join(str(exc).split())[:300] or type(exc).__name__  # one line
        raise ConfigError(f"comm.gossip.topology: cannot read graph file {path}: {why}") from None
    g = nx.Graph(g)
    nodes = list(g.nodes())  # GML ids may be strings or floats: compare without sorting mixed types
    if (len(nodes) != n or not all(isinstance(v, int) and not isinstance(v, bool) for v in nodes)
            or set(nodes) != set(range(n))):
        raise ConfigError(f"comm.gossip.topology: graph file {path} must have nodes 0..{n - 1} (one per rank)")
    if not nx.is_connected(g):
        raise ConfigError(f"comm.gossip.topology: graph file {path} is not connected; gossip would not reach consensus")
    return g


class Topology:
    """Mixing weights per round for ``n`` ranks."""

    def __init__(self, name: str, n: int) -> None:
        self.name, self.n = name, n
        self.graph = graph_for(name, n)
        self._static = _metropolis(self.graph, n) if self.graph is not None else None

    def mixing(self, t: int) -> Tensor:
        """``[n, n]`` weights of round t (rows: receivers, columns: senders)."""
        if self._static is not None:
            return self._static
        n = self.n
        if n == 1:
            return torch.ones(1, 1, dtype=torch.float64)
        hop = 2 ** (t % max(1, math.ceil(math.log2(n))))
        W = torch.zeros(n, n, dtype=torch.float64)
        for i in range(n):
            W[i, i] += 0.5
            W[i, (i - hop) % n] += 0.5
        return W

    def peers(self, t: int, rank: int) -> tuple[list[int], list[int]]:
        """(ranks ``rank`` sends to, ranks it receives from) in round t."""
        W = self.mixing(t)
        send = [j for j in range(self.n) if j != rank and W[j, rank] > 0]
        recv = [j for j in range(self.n) if j != rank and W[rank, j] > 0]
        return send, recv
