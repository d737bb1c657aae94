"""``commgnn calibrate``'s config: where the fitted link model goes and how it is measured."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class CalibrateConfig:
    """One calibration: where the model goes, and how it is measured."""

    out: str | None = None
    """JSON file to write the fitted model to (required)."""
    parts: int = 2
    """Local ranks when not under torchrun."""
    timeout_s: float = 300.0
    """Collective time-out in seconds."""
    sizes: tuple[int, ...] = ()
    """Ping-pong message sizes in bytes; empty: 1000,10000,100000,1000000,4000000."""
