"""Measurement: the byte/time meter and memory."""

from commgnn.metrics.meter import CLASSES, EpochTraffic, Meter, peak_rss_mb

__all__ = ["CLASSES", "EpochTraffic", "Meter", "peak_rss_mb"]
