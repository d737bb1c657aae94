"""Louvain communities of a graph, memoised per process (networkx's Louvain; the memo is ours).

:func:`louvain_communities` depends on the graph and the seed alone, not on the number of
clients a split then deals the communities to, and takes seconds (about 7 s on Coauthor
CS), which a sweep over clients and algorithms on one seed would otherwise pay on every run.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import networkx as nx
from torch import Tensor

_COMMUNITIES: OrderedDict[tuple[int, int, str], tuple[frozenset[int], ...]] = OrderedDict()
_COMMUNITIES_KEPT = 4


def louvain_communities(graph: nx.Graph, edge_index: Tensor, n: int, seed: int) -> tuple[frozenset[int], ...]:
    """networkx's Louvain communities of ``graph`` (built from ``edge_index [2, E]`` over
    ``n`` nodes). The memo's key hashes ``edge_index`` itself, so another graph with as many
    nodes never reads a stale entry."""
    digest = hashlib.sha1(edge_index.contiguous().numpy().tobytes()).hexdigest()
    key = (n, seed, digest)
    if key in _COMMUNITIES:
        _COMMUNITIES.move_to_end(key)
        return _COMMUNITIES[key]
    found = tuple(frozenset(c) for c in nx.community.louvain_communities(graph, seed=seed))
    _COMMUNITIES[key] = found
    while len(_COMMUNITIES) > _COMMUNITIES_KEPT:
        _COMMUNITIES.popitem(last=False)
    return found
