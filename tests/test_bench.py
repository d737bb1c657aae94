"""`commgnn bench`: a grid of real runs, aggregated against the exact exchange."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from commgnn.api.bench import load_grid, pareto_front, traffic_axis
from commgnn.cli.main import main
from commgnn.errors import ConfigError, UserError

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


@pytest.mark.slow  # trains a small grid; the report-only tests below cover the tables in CI
def test_bench_grid_writes_tables_with_ratios_to_exact(tmp_path, capsys):
    grid = tmp_path / "g.toml"
    grid.write_text(GRID)
    out = tmp_path / "bench"
    assert main(["bench", "--grid", str(grid), "--out", str(out)]) == 0
    # each finished run is reported as it ends (a long grid shows its progress)
    s0 = json.loads((out / "runs" / "synthetic-gcn-p2-exact-s0" / "summary.json").read_text())
    assert (f"[bench] synthetic-gcn-p2-exact-s0: test {100 * s0['test_acc']:.2f}%, best epoch {s0['best_epoch']} "
            f"of {s0['epochs_run']}, halo {s0['halo_bytes_per_epoch'] / 1e6:.2f} MB/epoch") in capsys.readouterr().out
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


def test_grid_entries_change_model_keys(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text('[base]\nmodel = { hidden = 32 }\n[[halo]]\nname = "exact"\n'
                    '[[halo]]\nname = "maxk8"\nmodel = { activation = "maxk", maxk_k = 8 }\nbits = 4\n')
    _, _, settings, reference = load_grid(str(grid))
    assert reference == "exact"
    assert settings[1].model == {"activation": "maxk", "maxk_k": 8} and settings[1].comm.halo != settings[0].comm.halo
    # an override that is not a valid [model] (k above hidden, unknown key) is refused up front
    grid.write_text('[base]\nmodel = { hidden = 32 }\n[[halo]]\nname = "exact"\n'
                    '[[halo]]\nname = "maxk"\nmodel = { activation = "maxk", maxk_k = 64 }\n')
    with pytest.raises(ConfigError, match="cannot exceed model.hidden"):
        load_grid(str(grid))
    grid.write_text('[[halo]]\nname = "exact"\n[[halo]]\nname = "x"\nmodel = { width = 3 }\n')
    with pytest.raises(ConfigError, match="width"):
        load_grid(str(grid))
    # an entry that only changes the model is not the exact reference
    grid.write_text('[[halo]]\nname = "relu"\nmodel = { activation = "relu" }\n')
    with pytest.raises(ConfigError, match="needs an exact entry"):
        load_grid(str(grid))


def test_an_entrys_model_keys_apply_together(tmp_path, monkeypatch):
    """``activation = "maxk"`` alone would be checked against the default ``maxk_k`` (32),
    above this base's hidden (16): the entry's keys are applied, and validated, at once."""
    import commgnn.runner.local as launch
    from commgnn.api.bench import run_grid

    ran = []
    fake = {"test_acc": 0.0, "best_epoch": 0, "epochs_run": 0, "halo_bytes_per_epoch": 0.0}
    monkeypatch.setattr(launch, "train_local", lambda cfg: ran.append(cfg.model) or fake)
    grid = tmp_path / "g.toml"
    grid.write_text(GRID.replace("hidden = 8", "hidden = 16").split("[[halo]]")[0] + '[[halo]]\nname = "exact"\n'
                    '[[halo]]\nname = "maxk8"\nmodel = { activation = "maxk", maxk_k = 8 }\nbits = 4\n')
    with pytest.raises(UserError, match="not a finished commgnn run"):  # nothing trained, nothing to tabulate
        run_grid(str(grid), tmp_path / "bench")
    assert [(m.activation, m.maxk_k, m.hidden) for m in ran] == [("auto", 32, 16)] * 2 + [("maxk", 8, 16)] * 2


def test_pareto_plots_the_traffic_the_grid_varies(tmp_path):
    from commgnn.comm.config import CommConfig, GossipConfig, GradConfig, HaloConfig

    halo = [CommConfig(), CommConfig(halo=HaloConfig(bits=4))]
    grad = [CommConfig(), CommConfig(grad=GradConfig(strategy="topk")), CommConfig(gossip=GossipConfig())]
    assert traffic_axis(halo) == "halo" and traffic_axis(grad) == "grad"
    assert traffic_axis(halo + grad) == "total"


def test_pareto_front():
    pts = [(10.0, 0.9), (5.0, 0.85), (5.0, 0.80), (1.0, 0.5), (20.0, 0.88)]
    assert sorted(pareto_front(pts)) == [0, 1, 3]


_SUMMARY = {"test_acc": 0.5, "best_val_acc": 0.5, "halo_bytes_per_epoch": 10, "grad_bytes_per_epoch": 4,
            "epoch_time_s": 0.01}


def _fake_run(out: Path, slug: str, summary: str | None = json.dumps(_SUMMARY),
              metrics: str | None = '{"epoch_s": 0.01, "val_acc": 0.5}\n') -> Path:
    run = out / "runs" / f"synthetic-gcn-p2-{slug}-s0"
    run.mkdir(parents=True)
    if summary is not None:
        (run / "summary.json").write_text(summary)
    if metrics is not None:
        (run / "metrics.jsonl").write_text(metrics)
    return run


REPORT_ONLY_BAD = {
    "empty folder": (lambda out: out.mkdir(), "no finished runs of this grid in {out}; run the grid first"),
    "no folder": (lambda out: None, "no finished runs in {out} (no such folder); run the grid first"),
    "foreign files": (lambda out: (out.mkdir(), (out / "notes.txt").write_text("hi"),
                                   (out / "runs" / "something-else").mkdir(parents=True)),
                      "no finished runs of this grid in {out}"),
    "a file, not a folder": (lambda out: out.write_text("x"), "bench output {out} is a file, not a folder"),
    "corrupt summary": (lambda out: _fake_run(out, "exact", summary="{not json"),
                        "{out}/runs/synthetic-gcn-p2-exact-s0/summary.json is not a commgnn run summary "
                        "(invalid JSON"),
    "summary of something else": (lambda out: _fake_run(out, "exact", summary='{"accuracy": 1}'),
                                  "{out}/runs/synthetic-gcn-p2-exact-s0/summary.json is not a commgnn run "
                                  "summary (missing or non-numeric 'test_acc')"),
    "summary a list": (lambda out: _fake_run(out, "exact", summary="[1, 2]"), "(a JSON list, not an object)"),
    "no metrics": (lambda out: _fake_run(out, "exact", metrics=None),
                   "{out}/runs/synthetic-gcn-p2-exact-s0/metrics.jsonl is missing"),
    "corrupt metrics": (lambda out: _fake_run(out, "exact", metrics='{"epoch_s": 0.1}\n'),
                        "metrics.jsonl is not a commgnn metrics log (missing or non-numeric 'val_acc')"),
    "no reference runs": (lambda out: _fake_run(out, "lossless_8bit"),
                          "no finished runs of the reference entry 'exact' in {out}"),
}


@pytest.mark.parametrize("case", sorted(REPORT_ONLY_BAD))
def test_report_only_on_a_folder_without_runs_is_one_line(case, tmp_path, capsys):
    grid = tmp_path / "g.toml"
    grid.write_text(GRID)
    out = tmp_path / "bench"
    make, expected = REPORT_ONLY_BAD[case]
    make(out)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    capsys.readouterr()
    assert main(["bench", "--grid", str(grid), "--report-only", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("commgnn: error: "), err
    assert expected.format(out=out) in err, err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written


def test_report_only_tabulates_valid_records(tmp_path, capsys):
    grid = tmp_path / "g.toml"
    grid.write_text(GRID)
    out = tmp_path / "bench"
    _fake_run(out, "exact")
    assert main(["bench", "--grid", str(grid), "--report-only", "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [r["setting"] for r in rows] == ["exact"] and float(rows[0]["reduction_vs_exact"]) == 1.0


def test_tables_count_the_one_time_set_up_exchange(tmp_path):
    """precompute's input rows travel once before training: the table shows them and a
    reduction over the whole run that includes them (40 epochs: 10 + 400 / 40 = 20 bytes an
    epoch against exact's 100); a summary written before set-up bytes were kept shows '?'."""
    grid = tmp_path / "g.toml"
    grid.write_text(GRID)
    out = tmp_path / "bench"
    _fake_run(out, "exact", summary=json.dumps({**_SUMMARY, "halo_bytes_per_epoch": 100, "epochs_run": 40,
                                                "setup_bytes": {"halo_setup": 0}}))
    _fake_run(out, "lossless_8bit", summary=json.dumps({**_SUMMARY, "epochs_run": 40, "setup_s": 2.0,
                                                        "setup_bytes": {"halo_setup": 400, "control": 8}}))
    assert main(["bench", "--grid", str(grid), "--report-only", "--out", str(out)]) == 0
    rows = {r["setting"]: r for r in csv.DictReader((out / "results.csv").open())}
    assert float(rows["lossless+8bit"]["reduction_vs_exact"]) == pytest.approx(10.0)
    assert float(rows["lossless+8bit"]["halo_setup_bytes"]) == 400
    assert float(rows["lossless+8bit"]["reduction_incl_setup_vs_exact"]) == pytest.approx(5.0)
    # its time to exact's best validation accuracy starts with its set-up (2 s) before epoch 1 (0.01 s)
    assert float(rows["lossless+8bit"]["time_to_exact_best_val_s"]) == pytest.approx(2.01)
    assert float(rows["exact"]["time_to_exact_best_val_s"]) == pytest.approx(0.01)
    assert "| 0.000 | 5.0x |" in (out / "results.md").read_text()
    old = tmp_path / "old"
    _fake_run(old, "exact")
    assert main(["bench", "--grid", str(grid), "--report-only", "--out", str(old)]) == 0
    assert "| ? | ? |" in (old / "results.md").read_text()
