"""Energy: CodeCarbon's offline tracker on every rank, the network's share from the bytes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from commgnn.errors import ConfigError
from commgnn.metrics.config import ASLAN_2020_J_PER_BYTE, J_PER_KWH, EnergyConfig
from commgnn.metrics.energy import energy_summary


def test_the_default_network_figure_is_aslan_et_al_projected_to_2020():
    assert ASLAN_2020_J_PER_BYTE == pytest.approx(0.0065 * 3.6e6 / 1e9)  # 0.0065 kWh/GB


@pytest.mark.parametrize("kwargs, message", [({"country_iso_code": "fr"}, "alpha-3"),
                                             ({"network_j_per_byte": -1.0}, "network_j_per_byte"),
                                             ({"measure_s": 0.0}, "measure_s")])
def test_bad_energy_settings_are_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        EnergyConfig(**kwargs)


def test_the_summary_adds_ranks_and_prices_the_network_at_the_grids_intensity():
    cfg = EnergyConfig(network_j_per_byte=1e-6)
    r0 = {"cpu_kwh": 1e-3, "ram_kwh": 2e-4, "co2_g": 0.6, "kg_per_kwh": 0.5, "measured_s": 9.0, "cpu_method": "x"}
    r1 = {**r0, "cpu_kwh": 3e-3, "co2_g": 1.6, "measured_s": 10.0}
    s = energy_summary([r0, r1, None], 7.2e9, cfg, epochs=4)
    net = 7.2e9 * 1e-6 / J_PER_KWH  # 2e-3 kWh
    assert s["energy"]["network_kwh"] == pytest.approx(net)
    assert s["energy_kwh"] == pytest.approx(4e-3 + 4e-4 + net)
    assert s["energy"]["network_co2_g"] == pytest.approx(1e3 * 0.5 * net)
    assert s["co2_g"] == pytest.approx(2.2 + 1e3 * 0.5 * net)
    assert s["energy"]["ranks_measured"] == 2 and s["energy"]["measured_s"] == 10.0
    none = energy_summary([None, None], 1e9, cfg, epochs=1)
    assert none["energy_kwh"] is None and none["energy"]["network_kwh"] == pytest.approx(1e9 * 1e-6 / J_PER_KWH)


@pytest.mark.timeout(180)
def test_a_run_reports_measured_cpu_ram_and_modelled_network_energy(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "COMMGNN_ENERGY"}
    (tmp_path / "small.toml").write_text("[data.synthetic]\nnum_nodes = 3000\n[energy]\nmeasure_s = 1.0\n"
                                         "country_iso_code = \"FRA\"\n")
    cmd = [sys.executable, "-m", "commgnn", "train", "--config", str(tmp_path / "small.toml"), "--parts", "2",
           "--epochs", "30", "--patience", "0", "--quiet"]
    subprocess.run([*cmd, "--out", str(tmp_path / "on")], check=True, env=env, timeout=150)
    s = json.loads((tmp_path / "on" / "summary.json").read_text())
    e = s["energy"]
    assert e["measured"] and e["ranks_measured"] == 2 and e["country_iso_code"] == "FRA"
    assert e["cpu_kwh"] > 0 and e["ram_kwh"] > 0 and e["measured_s"] > 0
    assert e["network_kwh"] == pytest.approx(s["total_bytes"] * ASLAN_2020_J_PER_BYTE / J_PER_KWH)
    assert s["energy_kwh"] == pytest.approx(e["cpu_kwh"] + e["ram_kwh"] + e["network_kwh"])
    assert s["co2_g"] > e["network_co2_g"] > 0


def test_energy_can_be_turned_off_by_flag_or_environment():
    from commgnn.runner.config import resolve_config

    assert resolve_config(None, {"energy_track": False}, {}).energy.track is False
    assert resolve_config(None, {"country": "DEU"}, {}).energy.country_iso_code == "DEU"
    with pytest.raises(ConfigError, match="alpha-3"):
        resolve_config(None, {"country": "Germany"}, {})
