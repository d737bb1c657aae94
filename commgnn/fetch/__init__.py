"""Fetching remote feature rows in mini-batch training: per-rank row caches and their bounds.

:mod:`~commgnn.fetch.cache` holds the caches (static, LRU), :mod:`~commgnn.fetch.policies`
what a static cache holds, :mod:`~commgnn.fetch.optimal` the offline optima to compare to.
These three never touch ``torch.distributed``: the collective that fetches the missed rows
lives with the caller.
"""

from commgnn.fetch.cache import LRUCache, RowCache, StaticCache
from commgnn.fetch.optimal import belady_hit_rate, optimal_static_hit_rate
from commgnn.fetch.policies import capacity_rows, degree_ranking, hotness_ranking

__all__ = ["LRUCache", "RowCache", "StaticCache", "belady_hit_rate", "capacity_rows", "degree_ranking",
           "hotness_ranking", "optimal_static_hit_rate"]
