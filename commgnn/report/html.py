"""``commgnn report``: one self-contained HTML page for run directories and bench grids.

:func:`write_report` reads each directory given, a run directory (``commgnn train --out``)
or a grid (``commgnn bench --out``: ``runs/``, ``results.csv``, ``grid.toml``), and writes a
single HTML file: inline CSS, every figure a PNG inlined as a ``data:`` URI, no external
resource and no script needed (one inline script only counts the loaded images into
``<body data-images-ok="N/N">``, for headless checks). Per run: accuracy and loss curves,
bytes per epoch by traffic class, the compute / comm / wait split of an epoch, bytes by
sender and receiver, bytes by layer, status, manifest and configuration. Per grid: the
results table, accuracy against bytes with its Pareto front, the runs overlaid, and each run
in a collapsed section. Several directories: one section each, plus an overlay of their
curves.

The folders are read by :mod:`commgnn.report.runs`. A run without ``summary.json``
(failed, interrupted, running) is reported from ``metrics.jsonl`` with its state. A last
record cut short (a full disk) is left out with a warning on the page and on standard
error; the records before it are shown. A missing
directory, a directory that is no run or grid, a corrupt record or an unwritable output is a
one-line :class:`~commgnn.errors.UserError`;
the page is rendered in memory, written to a temporary file and renamed, so nothing is
ever half-written.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import os
import shlex
import socket
import statistics
import struct
import sys
import tomllib
from pathlib import Path
from typing import Any, Iterable, Sequence

from commgnn.errors import UserError
from commgnn.report import plots
from commgnn.report.console import human_bytes
from commgnn.report.runs import Grid, Run, is_num, load


def _pct(v: Any) -> str:
    return "—" if v is None else f"{100 * v:.2f}%"


def _best(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    rows = [r for r in rows if r["val_acc"] is not None]
    return max(rows, key=lambda r: (r["val_acc"], -r["epoch"])) if rows else None


def _mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return statistics.mean(values) if values else None


def headline(run: Run) -> dict[str, Any]:
    """The key numbers: from ``summary.json``, else computed from ``metrics.jsonl``."""
    s, rows = run.summary, run.rows
    if s is not None:
        return {k: s.get(k) for k in ("epochs_run", "best_epoch", "best_val_acc", "test_acc", "halo_bytes_per_epoch",
                                      "halo_bytes_per_epoch_max_rank", "grad_bytes_per_epoch", "total_bytes",
                                      "epoch_time_s", "comm_time_frac", "wait_time_frac", "peak_rss_mb")}
    best = _best(rows)
    halo = [sum(v for k, v in r["bytes"].items() if k in ("halo_fwd", "halo_bwd")) for r in rows]
    epoch_mean = sum(r["time"].get("epoch", 0.0) for r in rows)
    frac = {p: sum(r["time"].get(p, 0.0) for r in rows) / epoch_mean if epoch_mean > 0 else None
            for p in ("comm", "wait")}
    return {"epochs_run": len(rows), "best_epoch": best and best["epoch"], "best_val_acc": best and best["val_acc"],
            "test_acc": best and best["test_acc"], "halo_bytes_per_epoch": _mean(halo),
            "grad_bytes_per_epoch": _mean(r["bytes"].get("grad_sync", 0.0) for r in rows),
            "total_bytes": sum(sum(r["bytes"].values()) for r in rows) if rows else None,
            "epoch_time_s": statistics.median(r["epoch_s"] for r in rows if r["epoch_s"] is not None)
            if any(r["epoch_s"] is not None for r in rows) else None,
            "comm_time_frac": frac["comm"], "wait_time_frac": frac["wait"]}


def _levers(config: str | None, recorded: Any = None) -> str | None:
    """The run's model and communication settings in a few words (from config.toml; the
    model from the manifest's ``model`` entry when it records the user's own model)."""
    try:
        cfg = tomllib.loads(config or "")
        m, comm = cfg.get("model", {}), cfg.get("comm", {})
        halo, grad = comm.get("halo", {}), comm.get("grad", {})
        words = []
        if halo.get("precompute"):
            words.append("precompute" + (" (matched dropout)" if halo.get("precompute_dropout") == "matched" else ""))
        if halo.get("transform_first"):
            words.append("transform-first")
        bits = halo.get("bits", 32)
        if isinstance(bits, dict) and (bits.get("forward"), bits.get("backward")) != (32, 32):
            words.append(f"{bits.get('forward')}/{bits.get('backward')}-bit")
        elif bits not in (32, None) and not isinstance(bits, dict):
            words.append(f"{bits}-bit")
        if halo.get("sample_rate", 1.0) < 1.0:
            words.append(f"sample {halo['sample_rate']:g}")
        if halo.get("staleness", {}).get("mode", "none") != "none":
            words.append(f"staleness {halo['staleness']['mode']}")
        sync = f"grad {grad.get('strategy', 'allreduce')}"
        if comm.get("gossip"):
            sync = f"gossip {comm['gossip'].get('topology', '')} {comm['gossip'].get('method', '')}".strip()
        model = f"{m.get('name', '?')} ({m.get('layers', '?')} layers, hidden {m.get('hidden', '?')})"
        if isinstance(recorded, dict) and recorded.get("own"):  # config.toml's [model] did not run
            model = f"your {recorded.get('name', '?')} ({recorded.get('module', '?')})"
        return f"{model}; halo {', '.join(words) or 'exact'}; {sync}"
    except (tomllib.TOMLDecodeError, AttributeError, TypeError, KeyError, ValueError):
        return None


def _status_text(run: Run) -> str:
    st = run.status
    text = run.state
    if run.state == "running" and is_num(st.get("pid")):
        host = ((run.manifest or {}).get("host") or {}).get("hostname")
        if host in (None, socket.gethostname()):
            try:
                os.kill(int(st["pid"]), 0)
            except ProcessLookupError:
                text += f" (but its launcher, pid {st['pid']}, is gone: killed or crashed)"
            except OSError:
                pass
    return text


# ---------------------------------------------------------------- HTML


def _e(v: Any) -> str:
    return html.escape(str(v), quote=True)


def _img(png: bytes, alt: str) -> str:
    width, height = struct.unpack(">II", png[16:24])  # the IHDR chunk
    return (f'<img src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}" alt="{_e(alt)}" '
            f'width="{width}" height="{height}">')


def _figure(level: int, title: str, png: bytes, caption: str = "", wide: bool = False) -> str:
    cls = ' class="wide"' if wide else ""
    cap = f"<figcaption>{_e(caption)}</figcaption>" if caption else ""
    return f"<figure{cls}><h{level}>{_e(title)}</h{level}>{_img(png, title)}{cap}</figure>"


def _kv_table(pairs: Iterable[tuple[str, Any]], cls: str = "kv") -> str:
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in pairs)
    return f'<table class="{cls}">{body}</table>'


def _short(v: Any) -> str:
    if isinstance(v, list):
        head = ", ".join(_short(x) for x in v[:12])
        return head + (f", … ({len(v)} in all)" if len(v) > 12 else "")
    if isinstance(v, float):
        return f"{v:.6g}"
    return "—" if v is None else str(v)


def _flatten(obj: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    out = []
    for k, v in obj.items():
        if isinstance(v, dict) and v:
            out += _flatten(v, f"{prefix}{k}.")
        elif k == "argv" and isinstance(v, list):
            out.append((prefix + k, shlex.join(str(a) for a in v)))
        else:
            out.append((prefix + k, _short(v)))
    return out


def _facts(run: Run) -> list[tuple[str, str]]:
    h = headline(run)
    man = run.manifest or {}
    ds = man.get("dataset") if isinstance(man.get("dataset"), dict) else {}
    parts = (run.summary or {}).get("parts") or ((man.get("partition") or {}).get("report") or {}).get("num_parts")
    src = "" if run.summary else " (from metrics.jsonl)"
    bytes_ = (lambda v: "—" if v is None else human_bytes(v))
    out = [("state", _status_text(run))]
    if ds:
        out.append(("graph", f"{ds.get('name', '?')}: {ds.get('num_nodes', '?')} nodes, "
                             f"{ds.get('num_edges', '?')} edges, {ds.get('num_classes', '?')} classes"))
    setting = _levers(run.config, man.get("model"))
    if setting:
        out.append(("model, levers", setting))
    out += [("ranks", _short(parts)),
            ("epochs run (best val epoch)", f"{_short(h['epochs_run'])} ({_short(h['best_epoch'])})"),
            ("best val acc" + src, _pct(h["best_val_acc"])),
            ("test acc at best val" + src, _pct(h["test_acc"])),
            ("halo bytes / epoch (all ranks)", bytes_(h["halo_bytes_per_epoch"])),
            ("grad bytes / epoch (all ranks)", bytes_(h["grad_bytes_per_epoch"])),
            ("total bytes", bytes_(h["total_bytes"])),
            ("epoch time (median, slowest rank)", _fmt(h["epoch_time_s"], ".1f", 1000) + " ms"),
            ("comm / wait share of epoch", f"{_pct(h['comm_time_frac'])} / {_pct(h['wait_time_frac'])}")]
    if h.get("peak_rss_mb") is not None:
        out.append(("peak RSS (max rank)", f"{h['peak_rss_mb']:.0f} MB"))
    return out


def run_section(run: Run, anchor: str, level: int = 2) -> str:
    h = level + 1
    state = _e(run.state)
    parts = [f'<section class="run" id="{anchor}"><h{level}>Run {_e(run.name)} '
             f'<span class="state state-{state}">{state}</span></h{level}>',
             f'<p class="path">{_e(run.path.resolve())}</p>']
    if run.status.get("error"):
        parts.append(f'<p class="error">{_e(run.status["error"])}</p>')
    if run.status.get("signal"):
        parts.append(f'<p class="error">stopped by {_e(run.status["signal"])}</p>')
    for w in run.warnings:
        parts.append(f'<p class="warning">warning: {_e(w)}</p>')
    if run.notes:
        parts.append('<ul class="notes">' + "".join(f"<li>{_e(n)}</li>" for n in run.notes) + "</ul>")
    facts = _facts(run)
    half = (len(facts) + 1) // 2
    parts.append(f'<div class="facts">{_kv_table(facts[:half])}{_kv_table(facts[half:])}</div>')
    figs = []
    if run.rows:
        best = (run.summary or {}).get("best_epoch") or (_best(run.rows) or {}).get("epoch")
        figs.append(_figure(h, "Accuracy and loss", plots.curves(run.rows, best),
                            "accuracy of train / validation / test nodes and the training loss, per epoch", wide=True))
        figs.append(_figure(h, "Bytes per epoch by traffic class", plots.bytes_per_epoch(run.rows),
                            "sum over ranks; log scale"))
        if any(r["time"] for r in run.rows):
            figs.append(_figure(h, "Time per epoch: compute, comm, wait", plots.time_split(run.rows),
                                "stacked: the mean rank's split; dashed: the slowest rank's epoch"))
    else:
        parts.append('<p class="note">no epochs recorded in metrics.jsonl: no curves</p>')
    if run.summary is not None:
        if any(run.summary.get("bytes_by_pair", {}).values()):
            figs.append(_figure(h, "Bytes by sender and receiver", plots.pair_heatmap(run.summary["bytes_by_pair"]),
                                "all classes and epochs; collectives counted on the ring pair (r, r+1 mod P)"))
        if run.summary.get("bytes_by_layer"):
            figs.append(_figure(h, "Bytes by layer", plots.bytes_by_layer(run.summary["bytes_by_layer"]),
                                "all ranks and epochs; 'other': collectives outside a layer (gradients, control)"))
    parts.append(f'<div class="figs">{"".join(figs)}</div>')
    status_rows = [(k, _short(v)) for k, v in run.status.items()]
    meta = [f"<div><h{h}>Status</h{h}>{_kv_table(status_rows)}</div>",
            f"<div><h{h}>Configuration</h{h}>"
            + (f'<pre class="config">{_e(run.config)}</pre>' if run.config is not None
               else '<p class="note">no config.toml</p>') + "</div>"]
    parts.append(f'<div class="meta">{"".join(meta)}</div><h{h}>Manifest</h{h}>')
    if run.manifest:
        rows = _flatten(run.manifest)
        third = (len(rows) + 2) // 3
        parts.append('<div class="facts manifest">' + "".join(_kv_table(rows[i:i + third])
                                                            for i in range(0, len(rows), third)) + "</div>")
    else:
        parts.append('<p class="note">no manifest.json</p>')
    parts.append("</section>")
    return "\n".join(parts)


def _fmt(v: Any, spec: str, scale: float = 1.0) -> str:
    return "—" if v is None else format(v * scale, spec)


_RESULT_COLS: list[tuple[str, Any]] = [
    ("dataset", lambda r: r["dataset"]), ("model", lambda r: r["model"]), ("P", lambda r: r["parts"]),
    ("setting", lambda r: r["setting"]), ("seeds", lambda r: _fmt(r.get("seeds"), ".0f")),
    ("test acc (mean ± std)", lambda r: f"{100 * r['test_acc_mean']:.2f} ± {100 * r['test_acc_std']:.2f}"),
    ("Δ vs ref (pts)", lambda r: _fmt(r.get("acc_delta_vs_exact_pts"), "+.2f")),
    ("halo / epoch", lambda r: human_bytes(r["halo_bytes_per_epoch"])),
    ("halo reduction", lambda r: _fmt(r.get("reduction_vs_exact"), ".1f") + "x"),
    ("halo set-up", lambda r: "?" if r.get("halo_setup_bytes") is None else human_bytes(r["halo_setup_bytes"])),
    ("reduction incl. set-up", lambda r: _fmt(r.get("reduction_incl_setup_vs_exact"), ".1f") + "x"),
    ("grad / epoch", lambda r: human_bytes(r["grad_bytes_per_epoch"])),
    ("grad reduction", lambda r: _fmt(r.get("grad_reduction_vs_exact"), ".1f") + "x"),
    ("epoch ms", lambda r: _fmt(r.get("epoch_time_s"), ".1f", 1000)),
    ("time ratio", lambda r: _fmt(r.get("time_ratio_vs_exact"), ".2f")),
    ("s to ref's best val", lambda r: _fmt(r.get("time_to_exact_best_val_s"), ".2f")
     + f" ({r.get('reached_exact_best_val') or '?'})")]


def _html_table(header: Sequence[str], rows: Iterable[Sequence[str]], raw: bool = False) -> str:
    head = "".join(f"<th>{_e(c)}</th>" for c in header)
    body = "".join("<tr>" + "".join(f"<td>{c if raw else _e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="data"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _runs_table(runs: list[Run], anchors: list[str]) -> str:
    rows = []
    for run, a in zip(runs, anchors):
        h = headline(run)
        rows.append([f'<a href="#{a}">{_e(run.name)}</a>', _e(run.state), _e(_short(h["epochs_run"])),
                     _pct(h["best_val_acc"]), _pct(h["test_acc"]),
                     "—" if h["halo_bytes_per_epoch"] is None else human_bytes(h["halo_bytes_per_epoch"]),
                     "—" if h["grad_bytes_per_epoch"] is None else human_bytes(h["grad_bytes_per_epoch"]),
                     _fmt(h["epoch_time_s"], ".1f", 1000)])
    return _html_table(["run", "state", "epochs", "best val", "test at best val", "halo / epoch",
                        "grad / epoch", "epoch ms"], rows, raw=True)


def _overlay(runs: list[Run], level: int) -> str:
    drawn = [(r.name, r.rows) for r in runs if r.rows]
    if len(drawn) < 2:
        return ""
    return _figure(level, "Runs compared", plots.overlay(drawn),
                   "test accuracy, training loss and halo + gradient bytes per epoch (all ranks)", wide=True)


def grid_section(grid: Grid, anchor: str) -> str:
    anchors = [f"{anchor}-r{j}" for j in range(len(grid.runs))]
    states: dict[str, int] = {}
    for r in grid.runs:
        states[r.state] = states.get(r.state, 0) + 1
    parts = [f'<section class="grid" id="{anchor}"><h2>Grid {_e(grid.name)}</h2>',
             f'<p class="path">{_e(grid.path.resolve())}: {len(grid.runs)} runs '
             f'({", ".join(f"{n} {s}" for s, n in sorted(states.items()))})</p>']
    if grid.notes:
        parts.append('<ul class="notes">' + "".join(f"<li>{_e(n)}</li>" for n in grid.notes) + "</ul>")
    figs = []
    if grid.table:
        parts.append("<h3>Results</h3>" + _html_table([c for c, _ in _RESULT_COLS],
                                                        ([str(f(r)) for _, f in _RESULT_COLS] for r in grid.table)))
        keys, xlabel = plots.traffic_axis(grid.table)
        figs.append(_figure(3, "Accuracy against bytes (Pareto)", plots.pareto(grid.table, keys, xlabel),
                            "mean ± std over seeds; lines: the Pareto front of each dataset, model and P", wide=True))
    figs.append(_overlay(grid.runs, 3))
    parts.append(f'<div class="figs">{"".join(figs)}</div>')
    parts.append("<h3>Runs</h3>" + _runs_table(grid.runs, anchors))
    for run, a in zip(grid.runs, anchors):
        parts.append(f"<details><summary>{_e(run.name)}: {_e(run.state)}</summary>{run_section(run, a, 3)}</details>")
    if grid.grid_toml is not None:
        parts.append(f'<h3>Grid file</h3><pre class="config">{_e(grid.grid_toml)}</pre>')
    parts.append("</section>")
    return "\n".join(parts)


CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#222;background:#f6f7f9;margin:0}
main{max-width:1320px;margin:0 auto;padding:18px 24px}
h1{font-size:24px;margin:4px 0}h2{font-size:20px;margin:0 0 4px}h3,h4{font-size:15px;margin:6px 0}
section{background:#fff;border:1px solid #dde1e6;border-radius:8px;padding:16px 20px;margin:18px 0}
section section{border:none;padding:8px 0;margin:0}
.path,.sub{color:#667;font-size:12px;margin:0 0 10px;word-break:break-all}
.state{font-size:12px;padding:2px 8px;border-radius:10px;vertical-align:middle;background:#ccd;color:#223}
.state-complete{background:#d4edda;color:#155724}.state-failed{background:#f8d7da;color:#721c24}
.state-interrupted,.state-running{background:#fff3cd;color:#856404}
.error{background:#fdecea;border-left:4px solid #c0392b;padding:6px 10px;font-family:monospace;font-size:12px}
.notes{color:#6a5a00;font-size:13px}.warning{color:#8a4b00;font-weight:600}.note{color:#667;font-style:italic}
table{border-collapse:collapse;font-size:13px}
.kv th{text-align:left;font-weight:600;padding:2px 14px 2px 0;color:#445;vertical-align:top;white-space:nowrap}
.kv td{padding:2px 0;font-variant-numeric:tabular-nums;word-break:break-word}
.facts{display:flex;flex-wrap:wrap;gap:4px 48px;margin:6px 0 12px}
.manifest{gap:4px 28px;font-size:12px}.manifest table{flex:1 1 300px;font-size:12px}
.data th,.data td{border-bottom:1px solid #e3e6ea;padding:4px 8px;text-align:right}
.data th{background:#f0f2f5}.data td:nth-child(-n+4),.data th:nth-child(-n+4){text-align:left}
.figs{display:grid;grid-template-columns:repeat(auto-fill,minmax(520px,1fr));gap:12px}
figure{margin:0;border:1px solid #eceef1;border-radius:6px;padding:8px;background:#fff;min-width:0}
figure.wide{grid-column:1/-1}
figure img{max-width:100%;height:auto;display:block;margin:0 auto}
figcaption{color:#667;font-size:12px;text-align:center}
.meta{display:grid;grid-template-columns:1fr 1fr;gap:16px;margin-top:10px}.meta>div{min-width:0}
pre.config{background:#f4f5f7;border:1px solid #e3e6ea;padding:8px;font-size:12px;margin:4px 0;
 max-height:320px;overflow:auto}
details{border-top:1px solid #e3e6ea;padding:6px 0}summary{cursor:pointer;font-weight:600}
nav ul{margin:4px 0;padding-left:20px}
"""

_COUNT_IMAGES = ("<script>window.addEventListener('load',function(){var im=document.images,n=0;"
                 "for(var i=0;i<im.length;i++){if(im[i].complete&&im[i].naturalWidth>0){n++;}}"
                 "document.body.dataset.imagesOk=n+'/'+im.length;});</script>")


def render(paths: Sequence[str | Path], title: str | None = None, warnings: list[str] | None = None) -> str:
    """The report page for ``paths`` (run directories and bench output folders), as text.
    The warnings shown on the page (a cut record) are appended to ``warnings`` when given."""
    if not paths:
        raise UserError("give at least one run directory or `commgnn bench` output folder")
    items = [load(Path(p)) for p in paths]
    if warnings is not None:
        for item in items:
            for run in item.runs if isinstance(item, Grid) else [item]:
                warnings.extend(run.warnings)
    names = ", ".join(i.name for i in items)
    title = title or f"commgnn report: {names if len(names) < 80 else names[:77] + '…'}"
    try:
        from importlib.metadata import version
        ver = version("commgnn")
    except Exception:  # noqa: BLE001 - not installed as a package: no version shown
        ver = "?"
    now = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    body = [f"<h1>{_e(title)}</h1>",
            f'<p class="sub">generated {_e(now)} by commgnn {_e(ver)} from {len(items)} '
            f"{'directory' if len(items) == 1 else 'directories'}</p>"]
    anchors = [f"s{i}" for i in range(len(items))]
    if len(items) > 1:
        kinds = [f"grid of {len(i.runs)} runs" if isinstance(i, Grid) else i.state for i in items]
        body.append("<nav><ul>" + "".join(f'<li><a href="#{a}">{_e(i.name)}</a> ({_e(k)})</li>'
                                          for i, a, k in zip(items, anchors, kinds)) + "</ul></nav>")
    runs = [(i, a) for i, a in zip(items, anchors) if isinstance(i, Run)]
    if len(runs) > 1:
        only = [r for r, _ in runs]
        body.append('<section id="compare"><h2>Comparison</h2>' + _runs_table(only, [a for _, a in runs])
                    + f'<div class="figs">{_overlay(only, 3)}</div></section>')
    for item, a in zip(items, anchors):
        body.append(grid_section(item, a) if isinstance(item, Grid) else run_section(item, a))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><title>{_e(title)}</title>"
            f"<style>{CSS}</style></head>\n<body><main>\n" + "\n".join(body)
            + f"\n</main>{_COUNT_IMAGES}</body></html>\n")


def _check_out(out: Path) -> None:
    if out.is_dir():
        raise UserError(f"--out {out} is a folder; give a file name, such as {out / 'report.html'}")
    parent = out.parent
    if not parent.is_dir():
        what = "is not a folder" if parent.exists() else "does not exist"
        raise UserError(f"cannot write {out}: {parent} {what}")


def write_report(paths: Sequence[str | Path], out: str | Path, *, title: str | None = None) -> Path:
    """Render the report for ``paths`` and write it to ``out`` atomically (temporary file,
    then rename): ``out`` is either the whole new page or left as it was. Each warning on
    the page (a record cut short) is also printed to standard error, one line each."""
    out = Path(out)
    _check_out(out)  # before the (slower) rendering, and the rename checks again
    warnings: list[str] = []
    page = render(paths, title, warnings).encode("utf-8")
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    try:
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as fh:
            fh.write(page)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, out)
    except OSError as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise UserError(f"cannot write {out}: {exc.strerror or exc}") from None
    for w in warnings:
        print(f"commgnn: warning: {w}", file=sys.stderr)
    return out
