"""``[fetch]``: how remote feature rows travel and are cached in mini-batch training.

Example::

    [fetch]
    bits = 4                # 1, 2, 4, 8 or 32 (float32 rows)
    sparse = false          # true: lossless index lists / bitmaps (with bits = 32)
    cache_ratio = 0.1       # or cache_mb = 64
    cache_policy = "degree" # degree (PaGraph) | presample (GNNLab) | lru
    prefetch = true
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Union

from commgnn.config import fraction, positive
from commgnn.errors import ConfigError

FETCH_BITS = (1, 2, 4, 8, 32)


@dataclass(frozen=True, kw_only=True)
class FetchConfig:
    """Remote feature rows: codec, cache and overlap."""

    bits: Union[int, Literal["adaptive"]] = 32
    """Bits per value of fetched rows: 32 = float32 as stored; 1, 2, 4, 8 = the halo
    exchange's stochastic row codes (within one quantisation step, unbiased);
    ``"adaptive"`` = widths per owner re-solved every epoch to fit ``budget_mb``."""
    sparse: bool = False
    """Send fetched rows through the lossless sparse codec (:mod:`commgnn.comm.sparse_codec`:
    index lists or bitmaps, values left out when all are 1.0, dense where that is smaller),
    one block per asker, at the cost of one more all-to-all per step (the block sizes).
    The same rows (a -0.0 arrives as 0.0) and training; for bag-of-words features (Coauthor CS keeps 59.6 of 6,805
    entries) a row costs ~122 bytes instead of 27,220. Needs ``bits = 32``."""
    budget_mb: float = 0.0
    """adaptive: feature-row MB (1e6 bytes) each rank may receive per epoch."""
    cache_mb: float = 0.0
    """Remote-row cache per rank in MB (1e6 bytes); 0 = no cache (unless ``cache_ratio``)."""
    cache_ratio: float = 0.0
    """Remote-row cache per rank as a fraction of the remote rows it may ever request (the
    other ranks' nodes within the model's reach of its seeds); 0 = off. Exclusive with
    ``cache_mb``."""
    cache_policy: Literal["degree", "presample", "lru"] = "degree"
    """degree: the highest-degree remote rows, fixed (PaGraph); presample: the rows most
    requested in pre-sampled epochs, fixed (GNNLab); lru: least recently used evicted."""
    presample_epochs: int = 1
    """presample: epochs sampled (without training) to rank the rows."""
    prefetch: bool = False
    """Sample and fetch the next batch in a background thread (own communicator) while
    the current one computes."""

    def __post_init__(self) -> None:
        if self.bits != "adaptive" and self.bits not in FETCH_BITS:
            raise ConfigError(f"fetch.bits must be one of 1, 2, 4, 8, 32 or 'adaptive', got {self.bits!r}")
        if self.sparse and self.bits != 32:
            raise ConfigError(f"fetch.sparse sends rows losslessly (float32 values, index lists or bitmaps); it "
                              f"does not combine with fetch.bits = {self.bits!r}: drop one of them")
        positive("fetch.budget_mb", self.budget_mb, allow_zero=True)
        if self.bits == "adaptive" and not self.budget_mb:
            raise ConfigError("fetch.bits = 'adaptive' needs fetch.budget_mb > 0 (MB of rows a rank receives per epoch)")
        positive("fetch.cache_mb", self.cache_mb, allow_zero=True)
        fraction("fetch.cache_ratio", self.cache_ratio)
        if self.cache_mb and self.cache_ratio:
            raise ConfigError("set fetch.cache_mb or fetch.cache_ratio, not both")
        if self.cache_policy not in ("degree", "presample", "lru"):
            raise ConfigError(f"fetch.cache_policy must be 'degree', 'presample' or 'lru', got {self.cache_policy!r}")
        positive("fetch.presample_epochs", self.presample_epochs)

    @property
    def cached(self) -> bool:
        return bool(self.cache_mb or self.cache_ratio)
