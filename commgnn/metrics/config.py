"""``[energy]``: how a run's energy is measured and modelled."""

from __future__ import annotations

from dataclasses import dataclass

from commgnn.config import positive
from commgnn.errors import ConfigError

J_PER_KWH = 3.6e6
ASLAN_2020_J_PER_BYTE = 0.0065 * J_PER_KWH / 1e9


@dataclass(frozen=True, kw_only=True)
class EnergyConfig:
    """``[energy]``: how a run's energy is measured and modelled."""

    track: bool = True
    """Measure CPU and RAM energy with CodeCarbon's offline tracker on every rank."""
    country_iso_code: str = "USA"
    """ISO 3166-1 alpha-3 code of where the machines run; sets the grid's carbon intensity."""
    network_j_per_byte: float = ASLAN_2020_J_PER_BYTE
    """Joules per byte sent between ranks (default: Aslan et al. 2018, projected to 2020)."""
    measure_s: float = 15.0
    """Seconds between CodeCarbon's power readings."""

    def __post_init__(self) -> None:
        code = self.country_iso_code
        if not (isinstance(code, str) and len(code) == 3 and code.isalpha() and code.isupper()):
            raise ConfigError(f"energy.country_iso_code must be an ISO 3166-1 alpha-3 code such as 'USA', "
                              f"'FRA' or 'DEU', got {code!r}")
        positive("energy.network_j_per_byte", self.network_j_per_byte, allow_zero=True)
        positive("energy.measure_s", self.measure_s)
