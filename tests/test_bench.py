"""`commgnn bench`: a grid of real runs, aggregated against the exact exchange."""

from __future__ import annotations

import csv
import json

import pytest

from commgnn.cli.bench import load_grid, pareto_front, traffic_axis
from commgnn.cli.main import main
from commgnn.errors import ConfigError

GRID = """
[base]
data = { synthetic = { num_nodes = 800, feature_dim = 16, num_classes = 3 } }
model = { layers = 2, hidden = 8 }
train = { epochs = 4, patience = 0 }

[grid]
datasets = ["synthetic"]
models = ["gcn"]
parts = [2]
seeds = [0, 1]

[[halo]]
name = "exact"

[[halo]]
name = "lossless+8bit"
precompute = true
transform_first = true
bits = 8
"""


def test_bench_grid_writes_tables_with_ratios_to_exact(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text(GRID)
    out = tmp_path / "bench"
    assert main(["bench", "--grid", str(grid), "--out", str(out)]) == 0
    rows = {r["setting"]: r for r in csv.DictReader((out / "results.csv").open())}
    assert set(rows) == {"exact", "lossless+8bit"}
    summaries = {name: [json.loads((out / "runs" / f"synthetic-gcn-p2-{slug}-s{s}" / "summary.json").read_text())
                        for s in (0, 1)] for name, slug in (("exact", "exact"), ("lossless+8bit", "lossless_8bit"))}
    mean = {k: sum(s["halo_bytes_per_epoch"] for s in v) / 2 for k, v in summaries.items()}
    assert float(rows["lossless+8bit"]["reduction_vs_exact"]) == pytest.approx(mean["exact"] / mean["lossless+8bit"])
    assert float(rows["exact"]["reduction_vs_exact"]) == pytest.approx(1.0)
    # 16 -> 8 -> 3, C rows: exact sends C*(16+8) forward and C*8 back; the lossless+8-bit run
    # sends layer 1 only: 3 columns at 8 bits each way, 3 + 8 bytes per row
    C = summaries["exact"][0]["partition"]["comm_volume"]
    assert mean["exact"] == C * (16 + 8 + 8) * 4
    assert mean["lossless+8bit"] == C * 2 * (3 + 8)
    assert (out / "pareto.png").stat().st_size > 0 and "±" in (out / "results.md").read_text()
    # a second call resumes: nothing is run again
    before = {p: p.stat().st_mtime for p in (out / "runs").glob("*/summary.json")}
    assert main(["bench", "--grid", str(grid), "--out", str(out)]) == 0
    assert before == {p: p.stat().st_mtime for p in (out / "runs").glob("*/summary.json")}
    # ... also when the grid was moved: where runs were written does not make them different
    moved = tmp_path / "moved"
    out.rename(moved)
    assert main(["bench", "--grid", str(grid), "--out", str(moved)]) == 0
    assert sorted(p.stat().st_mtime for p in (moved / "runs").glob("*/summary.json")) == sorted(before.values())


def test_grid_errors(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[grid]\nmodels = ["gcn"]\n[[halo]]\nname = "q"\nbits = 4\n')
    with pytest.raises(ConfigError, match="needs an exact entry"):
        load_grid(str(bad))
    bad.write_text('[[halo]]\nname = "exact"\n[[halo]]\nname = "q"\nbits = 3\n')
    with pytest.raises(ConfigError, match="must be one of 1, 2, 4, 8 or 32"):
        load_grid(str(bad))
    bad.write_text('[grid]\nreference = "nope"\n[[halo]]\nname = "exact"\n')
    with pytest.raises(ConfigError, match="grid.reference 'nope' names no entry"):
        load_grid(str(bad))
    bad.write_text('[grid]\nmodel = ["gcn"]\n')
    with pytest.raises(ConfigError, match="unknown config key 'grid.model'"):
        load_grid(str(bad))


def test_pareto_plots_the_traffic_the_grid_varies(tmp_path):
    from commgnn.comm.config import CommConfig, GossipConfig, GradConfig, HaloConfig

    halo = [CommConfig(), CommConfig(halo=HaloConfig(bits=4))]
    grad = [CommConfig(), CommConfig(grad=GradConfig(strategy="topk")), CommConfig(gossip=GossipConfig())]
    assert traffic_axis(halo) == "halo" and traffic_axis(grad) == "grad"
    assert traffic_axis(halo + grad) == "total"


def test_pareto_front():
    pts = [(10.0, 0.9), (5.0, 0.85), (5.0, 0.80), (1.0, 0.5), (20.0, 0.88)]
    assert sorted(pareto_front(pts)) == [0, 1, 3]
