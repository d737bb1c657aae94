"""What a static cache holds: PaGraph's degree ranking, GNNLab's pre-sampled hotness.

* PaGraph (Lin et al., SoCC 2020) observes that under neighbour sampling a node is pulled in
  roughly in proportion to its in-degree (it is a neighbour of that many nodes), so it
  caches the highest-degree rows; :func:`degree_ranking`.
* GNNLab (Yang et al., EuroSys 2022) measures instead: it runs the sampler for a few
  *pre-sampling* epochs, counts how often each node is requested, and caches the hottest;
  :func:`hotness_ranking`. This follows the real sampler (fan-outs, seeds, partition) rather
  than a proxy, at the price of the pre-sampling pass.

Both return ids in rank order (hottest first) with ties broken by the lower id, so the
choice is deterministic across ranks and runs. :func:`capacity_rows` turns a byte budget
into a row count.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _top_by_score(ids: Tensor, score: Tensor, capacity: int) -> Tensor:
    """``ids: [c]`` ascending, ``score: [c]`` -> the ``capacity`` ids of highest score.

    A stable sort on the negated score keeps ascending ids within equal scores, which is the
    lower-id tie rule without building a composite key (that could overflow int64)."""
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {capacity}")
    order = torch.sort(-score, stable=True).indices
    return ids[order[:capacity]]


def degree_ranking(candidates: Tensor, degree: Tensor, capacity: int) -> Tensor:
    """PaGraph: the ``capacity`` candidate ids of highest degree (ties by lower id).

    ``candidates: [c]`` int64 remote node ids this rank may request (duplicates are merged);
    ``degree: [N]`` global in-degree. Returns ``[min(capacity, #distinct candidates)]`` int64,
    highest degree first."""
    ids = torch.unique(candidates.reshape(-1).long())  # sorted ascending
    return _top_by_score(ids, degree.to(ids.device)[ids].long(), capacity)


def hotness_ranking(counts: Tensor, capacity: int) -> Tensor:
    """GNNLab's pre-sampling: the ``capacity`` hottest ids with count > 0 (ties by lower id).

    ``counts: [N]`` how often each (remote) id was requested in the pre-sampled epochs. Ids
    never requested are not cached even when space is left: caching them cannot save a
    byte on the sampled workload. Returns ``[<= capacity]`` int64, hottest first."""
    ids = (counts.reshape(-1) > 0).nonzero().view(-1)  # ascending
    return _top_by_score(ids, counts.reshape(-1)[ids], capacity)


def capacity_rows(cache_mb: float, num_features: int, element_size: int) -> int:
    """Rows of ``num_features`` elements of ``element_size`` bytes in ``cache_mb`` MB (1 MB =
    1e6 bytes), rounded down to whole rows."""
    if not math.isfinite(cache_mb) or cache_mb < 0:
        raise ValueError(f"cache_mb must be a finite number >= 0, got {cache_mb}")
    if num_features < 1 or element_size < 1:
        raise ValueError(f"num_features and element_size must be >= 1, got {num_features}, {element_size}")
    # Round the byte count to 1e-6 byte first: 0.000012 * 1e6 is 11.999999999999998 in
    # floating point, and flooring that would lose a row that fits exactly.
    nbytes = math.floor(round(cache_mb * 1e6, 6))
    return nbytes // (num_features * element_size)
