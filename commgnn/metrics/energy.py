"""Energy and CO2 of a run: CPU and RAM from CodeCarbon's offline tracker, the network
from the bytes the meter counted.

* **CPU and RAM** (measured): every rank runs a ``codecarbon.OfflineEmissionsTracker`` in
  ``process`` mode (its own process's share of the machine, so ranks sharing a machine are
  not counted twice) with an explicit country code; it never touches the network. Where
  the kernel exposes RAPL counters CodeCarbon reads them; elsewhere (VMs, containers) it
  falls back to a TDP model of the CPU times the process's CPU load, and the summary says
  which (``energy.cpu_method``). The tracker starts in a background thread, because its
  hardware probe takes seconds and training need not wait for it.
* **Network** (modelled): bytes sent x ``network_j_per_byte``. The default, 2.34e-5 J/byte
  (0.0065 kWh/GB), is Aslan et al.'s estimate for fixed-line Internet transmission
  (J. Industrial Ecology 22(4), 2018, doi:10.1111/jiec.12630: 0.06 kWh/GB in 2015,
  halving every two years, projected to 2020). Inside one data centre a byte costs less,
  and network power is not really proportional to traffic (Mytton et al., J. Industrial
  Ecology 2024): set the figure for your own network, and read the network share as what
  the bytes would cost at that rate.

The network's CO2 uses the carbon intensity CodeCarbon applied to the CPU and RAM energy
(the same country).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from commgnn.metrics.config import J_PER_KWH, EnergyConfig


class EnergyMeter:
    """One rank's CPU and RAM energy between :meth:`start` and :meth:`stop`."""

    def __init__(self, cfg: EnergyConfig) -> None:
        self.cfg = cfg
        self._tracker: Any = None
        self._thread: threading.Thread | None = None
        self.error: str | None = None

    def start(self) -> None:
        if not self.cfg.track:
            return
        self._thread = threading.Thread(target=self._start, name="commgnn-energy", daemon=True)
        self._thread.start()

    def _start(self) -> None:
        try:
            from codecarbon import OfflineEmissionsTracker

            logging.getLogger("codecarbon").setLevel(logging.ERROR)
            tracker = OfflineEmissionsTracker(
                country_iso_code=self.cfg.country_iso_code, measure_power_secs=self.cfg.measure_s,
                tracking_mode="process", save_to_file=False, log_level="error", allow_multiple_runs=True)
            tracker.start()
            self._tracker = tracker
        except Exception as exc:  # energy is a report, never a reason for a run to fail
            self.error = f"{type(exc).__name__}: {exc}"

    def stop(self) -> dict[str, Any] | None:
        """``{cpu_kwh, ram_kwh, co2_g, kg_per_kwh, measured_s, cpu_method}``, or None when not
        measured. ``measured_s`` starts when the tracker is ready, a few seconds into a run."""
        if self._thread is None:
            return None
        self._thread.join()
        if self._tracker is None:
            return None
        try:
            kg = self._tracker.stop() or 0.0
            data = self._tracker.final_emissions_data
            total = float(data.energy_consumed)
            return {"cpu_kwh": float(data.cpu_energy), "ram_kwh": float(data.ram_energy), "co2_g": 1e3 * float(kg),
                    "kg_per_kwh": float(kg) / total if total > 0 else 0.0,
                    "measured_s": float(data.duration),
                    "cpu_method": "; ".join(map(str, self._tracker._conf.get("hardware", [])))}
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            return None


def energy_summary(per_rank: list[dict[str, Any] | None], total_bytes: float, cfg: EnergyConfig,
                   epochs: int) -> dict[str, Any]:
    """``summary.json``'s energy keys from the ranks' readings and the bytes sent.

    ``energy_kwh`` and ``co2_g`` include the network; ``energy`` breaks them down."""
    net_kwh = total_bytes * cfg.network_j_per_byte / J_PER_KWH
    got = [r for r in per_rank if r]
    if not got:
        return {"energy_kwh": None, "co2_g": None,
                "energy": {"measured": False, "network_kwh": net_kwh, "network_j_per_byte": cfg.network_j_per_byte,
                           "country_iso_code": cfg.country_iso_code}}
    cpu = sum(r["cpu_kwh"] for r in got)
    ram = sum(r["ram_kwh"] for r in got)
    intensity = max(r["kg_per_kwh"] for r in got)  # the same country on every rank
    compute_co2 = sum(r["co2_g"] for r in got)
    net_co2 = 1e3 * intensity * net_kwh
    return {
        "energy_kwh": cpu + ram + net_kwh,
        "co2_g": compute_co2 + net_co2,
        "energy": {"measured": True, "ranks_measured": len(got), "cpu_kwh": cpu, "ram_kwh": ram,
                   "network_kwh": net_kwh, "network_share": net_kwh / max(cpu + ram + net_kwh, 1e-30),
                   "network_co2_g": net_co2, "kwh_per_epoch": (cpu + ram + net_kwh) / max(epochs, 1),
                   "network_j_per_byte": cfg.network_j_per_byte, "country_iso_code": cfg.country_iso_code,
                   "measured_s": max(r["measured_s"] for r in got), "cpu_method": got[0]["cpu_method"]},
    }
