"""`commgnn report`: one self-contained HTML page from real runs, a failed run and a grid.

The runs are made once per module with the real CLI (2 ranks, a small synthetic graph):
an exact run, a 4-bit halo run, a run whose rank 1 fails in epoch 3 (no summary.json) and
a two-entry `commgnn bench` grid. The page is parsed (stdlib HTMLParser) for its headings
and images; each image must be a PNG inlined as base64. Where a `chromium` binary is on the
PATH, the page is also rendered headless and every image must have loaded.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import struct
from html.parser import HTMLParser
from pathlib import Path

import pytest

from commgnn.cli.main import main
from commgnn.errors import UserError

CONFIG = """
[data.synthetic]
num_nodes = 800
num_classes = 3
feature_dim = 16
[model]
layers = 2
hidden = 8
[train]
epochs = 6
patience = 0
[runtime]
parts = 2
[output]
quiet = true
"""

FAULT = '[fault]\nrank = 1\nat = "train"\nepoch = 3\naction = "raise"\n'

GRID = """
[base]
data = { synthetic = { num_nodes = 800, feature_dim = 16, num_classes = 3 } }
model = { layers = 2, hidden = 8 }
train = { epochs = 4, patience = 0 }

[grid]
datasets = ["synthetic"]
models = ["gcn"]
parts = [2]
seeds = [0]

[[halo]]
name = "exact"

[[halo]]
name = "8bit"
bits = 8
"""

RUN_PLOTS = ("Accuracy and loss", "Bytes per epoch by traffic class", "Time per epoch: compute, comm, wait",
             "Bytes by sender and receiver", "Bytes by layer")
"""The figure headings of a finished run (the last two need summary.json)."""
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("report-runs")
    cfg = root / "run.toml"
    cfg.write_text(CONFIG)
    out = {"exact": root / "exact", "bits4": root / "bits4", "failed": root / "failed", "grid": root / "grid"}
    assert main(["train", "--config", str(cfg), "--out", str(out["exact"])]) == 0
    assert main(["train", "--config", str(cfg), "--bits", "4", "--out", str(out["bits4"])]) == 0
    failing = root / "failing.toml"
    failing.write_text(CONFIG + FAULT)
    assert main(["train", "--config", str(failing), "--out", str(out["failed"])]) == 1
    grid = root / "grid.toml"
    grid.write_text(GRID)
    assert main(["bench", "--grid", str(grid), "--out", str(out["grid"])]) == 0
    return out


class Page(HTMLParser):
    """Headings (text), images (attributes) and every src / href of a page."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.headings: list[str] = []
        self.images: list[dict[str, str]] = []
        self.links: list[str] = []
        self._heading: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in ("h1", "h2", "h3", "h4"):
            self._heading = []
        if tag == "img":
            self.images.append(attrs)
        self.links += [v for k, v in attrs.items() if k in ("src", "href") and v is not None]

    def handle_data(self, data):
        if self._heading is not None:
            self._heading.append(data)

    def handle_endtag(self, tag):
        if tag in ("h1", "h2", "h3", "h4") and self._heading is not None:
            self.headings.append(" ".join("".join(self._heading).split()))
            self._heading = None


def _report(capsys, out: Path, *dirs: Path) -> tuple[str, Page]:
    rc = main(["report", *map(str, dirs), "--out", str(out)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert captured.err == "" and captured.out.startswith(f"wrote {out}")
    text = out.read_text(encoding="utf-8")
    return text, Page(text)


def _check_self_contained(text: str, page: Page, expected_images: int) -> None:
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", text, re.I)
    assert "@import" not in text and "url(" not in text and "<link" not in text.lower()
    assert all(link.startswith(("data:image/png;base64,", "#")) for link in page.links), page.links
    assert len(page.images) == expected_images
    for img in page.images:
        assert img["src"].startswith("data:image/png;base64,")
        png = base64.b64decode(img["src"].split(",", 1)[1], validate=True)
        assert png[:8] == PNG_SIGNATURE
        width, height = struct.unpack(">II", png[16:24])
        assert (str(width), str(height)) == (img["width"], img["height"]) and width > 100 and height > 100


@pytest.mark.timeout(600)
def test_two_runs_side_by_side(runs, tmp_path, capsys):
    out = tmp_path / "report.html"
    text, page = _report(capsys, out, runs["exact"], runs["bits4"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]  # one file, no temporary left
    _check_self_contained(text, page, expected_images=1 + 2 * len(RUN_PLOTS))  # + the overlay
    assert {"Comparison", "Runs compared", "Run exact complete", "Run bits4 complete", "Status",
            "Manifest", "Configuration", *RUN_PLOTS} <= set(page.headings)
    assert page.headings.count("Bytes by layer") == 2
    # the records themselves are shown: config text, manifest fields, the lever
    assert "[comm.halo.bits]\nforward = 4\nbackward = 4" in text
    manifest = json.loads((runs["bits4"] / "manifest.json").read_text())
    assert manifest["dataset"]["fingerprint"] in text and "halo 4/4-bit" in text
    summary = json.loads((runs["exact"] / "summary.json").read_text())
    assert f"{100 * summary['test_acc']:.2f}%" in text


@pytest.mark.timeout(600)
def test_failed_run_is_reported_from_metrics_with_its_status(runs, tmp_path, capsys):
    assert not (runs["failed"] / "summary.json").exists()
    text, page = _report(capsys, tmp_path / "r.html", runs["failed"])
    _check_self_contained(text, page, expected_images=3)
    assert "Run failed failed" in page.headings
    assert set(RUN_PLOTS[:3]) <= set(page.headings) and not set(RUN_PLOTS[3:]) & set(page.headings)
    assert "injected fault at train of epoch 3" in text and "no summary.json" in text
    assert "(from metrics.jsonl)" in text


@pytest.mark.timeout(600)
def test_grid_report_has_results_and_pareto(runs, tmp_path, capsys):
    text, page = _report(capsys, tmp_path / "g.html", runs["grid"])
    _check_self_contained(text, page, expected_images=2 + 2 * len(RUN_PLOTS))  # Pareto, overlay, 2 runs
    assert {"Grid grid", "Results", "Accuracy against bytes (Pareto)", "Runs compared", "Runs",
            "Grid file"} <= set(page.headings)
    assert text.count("<details>") == 2 and ">8bit<" in text and ">exact<" in text


def _copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("partitions"))
    return dst


def _bad_cases(runs: dict[str, Path], tmp: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (report arguments, expected message part)."""
    (tmp / "empty").mkdir()
    (tmp / "a-file").write_text("x")
    corrupt_summary = _copy_run(runs["exact"], tmp / "corrupt-summary")
    (corrupt_summary / "summary.json").write_text('{"best_val_acc": 0.5, "test_')
    wrong_summary = _copy_run(runs["exact"], tmp / "wrong-summary")
    (wrong_summary / "summary.json").write_text('{"best_val_acc": 0.5, "test_acc": "high"}')
    bad_pairs = _copy_run(runs["exact"], tmp / "bad-pairs")
    s = json.loads((bad_pairs / "summary.json").read_text())
    s["bytes_by_pair"]["halo_fwd"] = [[0, 1]]
    (bad_pairs / "summary.json").write_text(json.dumps(s))
    corrupt_metrics = _copy_run(runs["exact"], tmp / "corrupt-metrics")
    lines = (corrupt_metrics / "metrics.jsonl").read_text().splitlines()
    (corrupt_metrics / "metrics.jsonl").write_text("\n".join([lines[0], "not json", *lines[1:]]) + "\n")
    ok = str(runs["exact"])
    return {
        "missing dir": ([str(tmp / "nope")], "does not exist"),
        "a file": ([str(tmp / "a-file")], "is not a directory"),
        "not a run dir": ([str(tmp / "empty")], "is not a commgnn run directory"),
        "corrupt summary": ([ok, str(corrupt_summary)], "summary.json is not a commgnn run summary (invalid JSON"),
        "wrong summary": ([str(wrong_summary)], "non-numeric 'test_acc'"),
        "bad pair matrix": ([str(bad_pairs)], "bytes_by_pair['halo_fwd'] is not a square matrix"),
        "corrupt metrics": ([str(corrupt_metrics)], "metrics.jsonl line 2 is not a commgnn metrics record"),
        "out in a file": ([ok, "--out", str(tmp / "a-file" / "r.html")], "is not a folder"),
        "out folder missing": ([ok, "--out", str(tmp / "no" / "r.html")], "does not exist"),
        "out is a folder": ([ok, "--out", str(tmp / "empty")], "is a folder"),
    }


@pytest.mark.timeout(600)
def test_bad_input_is_one_line_and_writes_nothing(runs, tmp_path, capsys):
    target = tmp_path / "out" / "report.html"
    target.parent.mkdir()
    target.write_text("the previous report")
    for name, (args, message) in _bad_cases(runs, tmp_path).items():
        argv = ["report", *args] + ([] if "--out" in args else ["--out", str(target)])
        rc = main(argv)
        err = capsys.readouterr().err
        assert rc == 2, name
        assert len(err.splitlines()) == 1 and err.startswith("commgnn: error: "), (name, err)
        assert message in err, (name, err)
        assert target.read_text() == "the previous report", name
        assert [p.name for p in target.parent.iterdir()] == ["report.html"], name


def test_a_failed_write_leaves_the_old_file(runs, tmp_path, monkeypatch):
    from commgnn.report import html as report_html

    target = tmp_path / "report.html"
    target.write_text("old")

    def no_space(*_args, **_kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report_html.os, "replace", no_space)
    with pytest.raises(UserError, match="cannot write .*report.html: No space left on device"):
        report_html.write_report([runs["failed"]], target)
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["report.html"]


def test_an_unfinished_last_line_of_a_stopped_run_is_skipped(runs, tmp_path, capsys):
    run = _copy_run(runs["failed"], tmp_path / "stopped")
    rows = (run / "metrics.jsonl").read_text()
    (run / "metrics.jsonl").write_text(rows + '{"epoch": 3, "lo')  # killed mid-write
    out = tmp_path / "r.html"
    assert main(["report", str(run), "--out", str(out)]) == 0
    assert "the last record (line 3, epoch 3) was cut short" in capsys.readouterr().err
    text = out.read_text()
    assert "the last record (line 3, epoch 3) was cut short" in text and len(Page(text).images) == 3


def test_a_record_cut_by_a_full_disk_is_reported_and_the_records_before_it_used(runs, tmp_path, capsys):
    """A finished run whose metrics.jsonl ends mid-record (a full disk cut the write): the
    report exits 0, says so on the page and on standard error (one line), and draws the
    epochs before the cut record."""
    run = _copy_run(runs["exact"], tmp_path / "cut")
    text = (run / "metrics.jsonl").read_text()
    lines = text.splitlines()
    assert len(lines) == 6
    (run / "metrics.jsonl").write_text(text[: len(text) - len(lines[-1]) // 2])  # epoch 6 cut in its middle
    out = tmp_path / "r.html"
    assert main(["report", str(run), "--out", str(out)]) == 0
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("commgnn: warning: "), err
    assert "the last record (line 6, epoch 6) was cut short" in err[0] and "using the 5 records before it" in err[0]
    page_text = out.read_text()
    assert '<p class="warning">warning: ' in page_text and "was cut short" in page_text
    from commgnn.report.runs import read_run

    parsed = read_run(run)
    assert [r["epoch"] for r in parsed.rows] == [1, 2, 3, 4, 5] and parsed.warnings
    assert not read_run(runs["exact"]).warnings  # a whole file: no warning


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.timeout(600)
@pytest.mark.skipif(_chromium() is None, reason="no chromium or chromium-browser on PATH (apt-get install chromium)")
def test_headless_chromium_loads_every_image(runs, tmp_path, capsys):
    out = tmp_path / "all.html"
    text, page = _report(capsys, out, runs["exact"], runs["bits4"], runs["failed"], runs["grid"])
    n = len(page.images)
    assert n == 1 + 2 * 5 + 3 + 2 + 2 * 5
    flags = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0"]
    dom = subprocess.run([*flags, "--dump-dom", out.as_uri()], capture_output=True, text=True, timeout=180)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert f'data-images-ok="{n}/{n}"' in dom.stdout, re.findall(r"<body[^>]*>", dom.stdout)
    assert "Uncaught" not in dom.stderr and "Failed to load resource" not in dom.stderr
    assert "Accuracy against bytes (Pareto)" in dom.stdout
    shot = tmp_path / "shot.png"
    res = subprocess.run([*flags, f"--screenshot={shot}", "--window-size=1280,1800", out.as_uri()],
                         capture_output=True, text=True, timeout=180)
    assert res.returncode == 0 and shot.read_bytes()[:8] == PNG_SIGNATURE, res.stderr[-2000:]
    width, height = struct.unpack(">II", shot.read_bytes()[16:24])
    assert (width, height) == (1280, 1800)
    try:
        from PIL import Image
    except ImportError:
        return
    colours = Image.open(shot).convert("L").getcolors(maxcolors=1 << 16)
    assert colours is None or len(colours) > 50  # not a blank page
