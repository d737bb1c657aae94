"""Remote feature rows in mini-batch training.

:mod:`~commgnn.fetch.fetcher` reads any node's rows: its own in place, others from a cache
or from their owners in one request-reply round per step (:mod:`commgnn.distributed.request`),
as float32, fixed-width codes or adaptive widths (:mod:`~commgnn.fetch.adaptive`).
:mod:`~commgnn.fetch.row_cache` holds the caches (static, LRU), :mod:`~commgnn.fetch.policies`
what a static cache holds, :mod:`~commgnn.fetch.optimal` the offline optima to compare to;
those three never touch ``torch.distributed``. ``[fetch]`` is :class:`FetchConfig`.
"""

from commgnn.fetch.row_cache import LRUCache, RowCache, StaticCache
from commgnn.fetch.config import FetchConfig
from commgnn.fetch.fetcher import FeatureFetcher
from commgnn.fetch.optimal import belady_hit_rate, optimal_static_hit_rate
from commgnn.fetch.policies import capacity_rows, degree_ranking, hotness_ranking

__all__ = ["FeatureFetcher", "FetchConfig", "LRUCache", "RowCache", "StaticCache", "belady_hit_rate",
           "capacity_rows", "degree_ranking", "hotness_ranking", "optimal_static_hit_rate"]
