"""The figures of ``commgnn report``, each rendered to PNG bytes.

Every function takes already checked plain data (see :mod:`commgnn.report.html`) and returns
the bytes of one PNG. Figures are built with :class:`matplotlib.figure.Figure` directly (no
pyplot), so rendering a report changes no global matplotlib state and needs no display.
"""

from __future__ import annotations

import io
import math
from typing import Any, Sequence

from commgnn.report.console import human_bytes

DPI = 100
CLASS_ORDER = ("halo_fwd", "halo_bwd", "halo_eval", "halo_setup", "grad_sync", "control")
"""Traffic classes in the order (and colours) every figure uses; unknown classes follow."""
SPLIT = (("compute", "#4c72b0"), ("comm", "#dd8452"), ("wait", "#c44e52"))
"""Phases of an epoch (keys of ``time_mean_s``), drawn bottom to top."""


def _figure(w: float, h: float, ncols: int = 1) -> tuple[Any, list[Any]]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=DPI)
    axes = [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]
    return fig, axes


def png(fig: Any) -> bytes:
    """The figure as PNG bytes (laid out tight, without a timestamp in its metadata)."""
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def _class_color(cls: str, classes: Sequence[str]) -> str:
    known = list(CLASS_ORDER)
    i = known.index(cls) if cls in known else len(known) + list(classes).index(cls)
    return f"C{i % 10}"


def ordered_classes(names: Any) -> list[str]:
    names = set(names)
    return [c for c in CLASS_ORDER if c in names] + sorted(names - set(CLASS_ORDER))


def _epochs_axis(*axes: Any) -> None:
    from matplotlib.ticker import MaxNLocator

    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("epoch")


def _bytes_axis(ax: Any, axis: str = "y") -> None:
    """Label an axis in bytes (KB, MB, ...); call after plotting. A log axis spanning less
    than two decades gets ticks at 1, 2 and 5 of each decade, so that it has some."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    which = ax.yaxis if axis == "y" else ax.xaxis
    lo, hi = sorted(ax.get_ylim() if axis == "y" else ax.get_xlim())
    if which.get_scale() == "log" and lo > 0 and hi / lo < 100:
        which.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    which.set_major_formatter(FuncFormatter(lambda v, _pos: human_bytes(v) if v > 0 else "0"))
    which.set_minor_formatter(NullFormatter())


def curves(rows: list[dict[str, Any]], best_epoch: int | None) -> bytes:
    """Train / validation / test accuracy (left) and training loss (right) per epoch."""
    fig, (acc, loss) = _figure(9.6, 3.6, ncols=2)
    ep = [r["epoch"] for r in rows]
    for key, label, style in (("train_acc", "train", ":"), ("val_acc", "validation", "-"),
                              ("test_acc", "test", "--")):
        pts = [(e, 100 * r[key]) for e, r in zip(ep, rows) if r.get(key) is not None]
        if pts:
            acc.plot(*zip(*pts), style, label=label, marker="." if len(pts) < 40 else None)
    if best_epoch is not None:
        acc.axvline(best_epoch, color="0.6", lw=0.8)
        right = best_epoch > (ep[0] + ep[-1]) / 2 if ep else False  # keep the label inside the axes
        acc.annotate(f"best val (epoch {best_epoch})", (best_epoch, 0.02), xycoords=("data", "axes fraction"),
                     fontsize=7, color="0.4", xytext=(-3 if right else 3, 0), textcoords="offset points",
                     ha="right" if right else "left")
    acc.set_ylabel("accuracy (%)")
    acc.grid(alpha=0.3)
    if acc.lines:
        acc.legend(fontsize=8, loc="center right")
    pts = [(e, r["loss"]) for e, r in zip(ep, rows) if r.get("loss") is not None]
    if pts:
        loss.plot(*zip(*pts), color="C3", marker="." if len(pts) < 40 else None)
    _epochs_axis(acc, loss)
    loss.set_ylabel("training loss")
    loss.grid(alpha=0.3)
    return png(fig)


def bytes_per_epoch(rows: list[dict[str, Any]]) -> bytes:
    """Bytes per epoch (all ranks) by traffic class, one line each, log scale."""
    fig, (ax,) = _figure(6.4, 3.8)
    classes = ordered_classes(c for r in rows for c in r["bytes"])
    zero = []
    for cls in classes:
        pts = [(r["epoch"], r["bytes"].get(cls, 0.0)) for r in rows]
        if not any(v > 0 for _, v in pts):
            zero.append(cls)
            continue
        ax.plot(*zip(*pts), label=cls, color=_class_color(cls, classes), lw=1.6,
                marker="." if len(pts) < 40 else None)
    if ax.lines:
        ax.set_yscale("log")
        ax.legend(fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    _bytes_axis(ax)
    _epochs_axis(ax)
    ax.set_ylabel("bytes per epoch (all ranks)")
    ax.grid(alpha=0.3, which="both")
    if zero:
        ax.set_title("zero, not drawn: " + ", ".join(zero), fontsize=8, color="0.4")
    return png(fig)


def time_split(rows: list[dict[str, Any]]) -> bytes:
    """The mean rank's epoch split into compute / comm / wait (stacked), and the slowest
    rank's epoch time (dashed)."""
    fig, (ax,) = _figure(6.4, 3.8)
    ep = [r["epoch"] for r in rows]
    stack = [[1000 * r["time"].get(k, 0.0) for r in rows] for k, _ in SPLIT]
    ax.stackplot(ep, *stack, labels=[f"{k} (mean rank)" for k, _ in SPLIT], colors=[c for _, c in SPLIT],
                 alpha=0.85, step=None)
    slow = [(e, 1000 * r["epoch_s"]) for e, r in zip(ep, rows) if r.get("epoch_s") is not None]
    if slow:
        ax.plot(*zip(*slow), "k--", lw=1, label="epoch (slowest rank)")
    _epochs_axis(ax)
    ax.set_ylabel("time per epoch (ms)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    return png(fig)


def pair_heatmap(by_pair: dict[str, list[list[float]]]) -> bytes:
    """Bytes sent from each rank (rows) to each rank (columns), summed over the classes of
    ``bytes_by_pair`` (``{class: [sender][receiver]}``), all epochs."""
    import numpy as np
    from matplotlib.colors import LogNorm, Normalize

    m = np.sum([np.asarray(v, dtype=float) for v in by_pair.values() if v], axis=0)
    p = m.shape[0]
    side = min(6.4, 2.6 + 0.35 * p)
    fig, (ax,) = _figure(side + 1.2, side)
    positive = m[m > 0]
    norm = None
    if positive.size and positive.max() > 20 * positive.min():
        norm = LogNorm(vmin=max(positive.min(), 1.0), vmax=positive.max())
    elif positive.size:
        norm = Normalize(vmin=0.0, vmax=positive.max())
    shown = np.where(m > 0, m, np.nan) if positive.size else m
    im = ax.imshow(shown, cmap="viridis", norm=norm, aspect="equal")
    cbar = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    _bytes_axis(cbar.ax)
    if p <= 12:
        for s in range(p):
            for r in range(p):
                v = m[s, r]
                dark = v > 0 and norm is not None and norm(v) < 0.6  # viridis is dark at the low end
                ax.text(r, s, human_bytes(v) if v > 0 else "0", ha="center", va="center",
                        fontsize=max(6, 10 - p // 2), color="white" if dark else "black")
    ticks = range(p) if p <= 32 else range(0, p, max(1, p // 16))
    ax.set_xticks(list(ticks))
    ax.set_yticks(list(ticks))
    ax.set_xlabel("receiver rank")
    ax.set_ylabel("sender rank")
    return png(fig)


def bytes_by_layer(by_layer: dict[str, dict[str, float]]) -> bytes:
    """Grouped bars: for each layer (and ``other``: collectives outside layers), the bytes
    of each traffic class (all ranks, all epochs)."""
    classes = [c for c in ordered_classes(by_layer) if any(v > 0 for v in by_layer[c].values())]
    layers: list[str] = []
    for c in ordered_classes(by_layer):
        layers += [k for k in by_layer[c] if k not in layers]
    layers.sort(key=lambda k: (not k.isdigit(), int(k) if k.isdigit() else 0, k))
    fig, (ax,) = _figure(6.4, 3.8)
    width = 0.8 / max(len(classes), 1)
    values = [v for c in classes for v in by_layer[c].values() if v > 0]
    for i, cls in enumerate(classes):
        xs = [j + (i - (len(classes) - 1) / 2) * width for j in range(len(layers))]
        ax.bar(xs, [by_layer[cls].get(k, 0.0) for k in layers], width, label=cls,
               color=_class_color(cls, ordered_classes(by_layer)))
    if values and max(values) / max(min(values), 1.0) > 20:
        ax.set_yscale("log")
    _bytes_axis(ax)
    ax.set_xticks(range(len(layers)))
    ax.set_xticklabels([f"layer {k}" if k.isdigit() else k for k in layers])
    ax.set_ylabel("bytes (all ranks, all epochs)")
    ax.grid(alpha=0.3, axis="y", which="both")
    if classes:
        ax.legend(fontsize=8)
    else:
        ax.set_title("no bytes by layer", fontsize=9)
    return png(fig)


def overlay(runs: list[tuple[str, list[dict[str, Any]]]]) -> bytes:
    """Several runs on one figure: test accuracy, loss and halo + gradient bytes per epoch."""
    fig, axes = _figure(14, 3.8, ncols=3)
    for i, (label, rows) in enumerate(runs):
        style = dict(color=f"C{i % 10}", ls=("-", "--", ":", "-.")[(i // 10) % 4], lw=1.4, label=label)
        ep = [r["epoch"] for r in rows]
        for ax, fn in ((axes[0], lambda r: None if r.get("test_acc") is None else 100 * r["test_acc"]),
                       (axes[1], lambda r: r.get("loss")),
                       (axes[2], lambda r: sum(v for k, v in r["bytes"].items() if k.startswith("halo_")
                                               and k != "halo_eval") + r["bytes"].get("grad_sync", 0.0))):
            pts = [(e, fn(r)) for e, r in zip(ep, rows) if fn(r) is not None]
            if pts:
                ax.plot(*zip(*pts), **style)
    for ax, ylabel in zip(axes, ("test accuracy (%)", "training loss", "halo + gradient bytes per epoch")):
        _epochs_axis(ax)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which="both")
    if any(v > 0 for line in axes[2].lines for v in line.get_ydata()):
        axes[2].set_yscale("log")
    _bytes_axis(axes[2])
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4), fontsize=8)
        fig.tight_layout(rect=(0, 0.06 * math.ceil(len(labels) / 4) + 0.04, 1, 1))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of points no other point beats on both fewer bytes and higher accuracy."""
    return [i for i, (b, a) in enumerate(points)
            if not any(b2 <= b and a2 >= a and (b2 < b or a2 > a) for j, (b2, a2) in enumerate(points) if j != i)]


def traffic_axis(table: list[dict[str, Any]]) -> tuple[tuple[str, ...], str]:
    """What the grid varies, hence the Pareto plot's x axis (as ``commgnn bench`` chooses)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in table:
        groups.setdefault((r["dataset"], r["model"], r["parts"]), []).append(r)
    varies = {k: any(len({round(r[k]) for r in g}) > 1 for g in groups.values())
              for k in ("halo_bytes_per_epoch", "grad_bytes_per_epoch")}
    if varies["halo_bytes_per_epoch"] and not varies["grad_bytes_per_epoch"]:
        return ("halo_bytes_per_epoch",), "halo bytes per epoch (all ranks, log)"
    if varies["grad_bytes_per_epoch"] and not varies["halo_bytes_per_epoch"]:
        return ("grad_bytes_per_epoch",), "gradient bytes per epoch (all ranks, log)"
    return ("halo_bytes_per_epoch", "grad_bytes_per_epoch"), "halo + gradient bytes per epoch (all ranks, log)"


def pareto(table: list[dict[str, Any]], keys: Sequence[str], xlabel: str) -> bytes:
    """Test accuracy (mean, ± std over seeds) against bytes per epoch, one point per setting,
    the Pareto front of each (dataset, model, P) drawn and its points named."""
    groups = sorted({(r["dataset"], r["model"], r["parts"]) for r in table}, key=str)
    fig, (ax,) = _figure(8, 4.6)
    for gi, g in enumerate(groups):
        rs = [r for r in table if (r["dataset"], r["model"], r["parts"]) == g]
        pts = [(max(sum(r[k] for k in keys), 1.0), 100 * r["test_acc_mean"]) for r in rs]
        color = f"C{gi % 10}"
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[100 * r["test_acc_std"] for r in rs],
                    fmt="o", color=color, alpha=0.7, capsize=3, label=f"{g[0]} {g[1]} P={g[2]}")
        front = sorted(pareto_front(pts), key=lambda i: pts[i][0])
        ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], color=color, lw=1.5)
        for i, r in enumerate(rs):
            ax.annotate(r["setting"], pts[i], fontsize=7, xytext=(4, 4), textcoords="offset points",
                        color="black" if i in front else "0.5")
    ax.set_xscale("log")
    _bytes_axis(ax, "x")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("test accuracy (%)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return png(fig)
