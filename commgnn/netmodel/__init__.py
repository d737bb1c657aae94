"""Network cost model: alpha-beta links per class, calibrated by a microbenchmark, and the
epoch time it predicts from a run's recorded bytes."""

from commgnn.netmodel.model import ClusterModel, Link, fit_link

__all__ = ["ClusterModel", "Link", "fit_link"]
