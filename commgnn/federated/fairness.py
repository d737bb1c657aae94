"""How evenly a federated model serves its clients: accuracy per client, degree and class.

Inputs are whole-graph tensors: ``pred`` ``[N]`` predicted classes (or ``[N, C]``
scores, reduced by argmax), ``y`` ``[N]`` labels (``-1`` = unlabelled), ``test_mask``
``[N]`` bool, ``owner`` ``[N]`` client ids (from :func:`commgnn.federated.client_split.split_clients`)
and ``degree`` ``[N]`` (whatever degree the caller wants to slice by, usually in-degree).
Only labelled test nodes count.

:func:`fairness_report` returns plain values (JSON-ready):

* ``clients``: per client ``{"client", "test_nodes", "accuracy", "bytes"}``; a client
  without test nodes has accuracy ``None`` (and is listed in ``clients_without_test``),
  never 0, and is left out of every statistic below;
* ``accuracy_overall``: over all test nodes (node-weighted);
* ``accuracy_mean`` / ``accuracy_std`` (population std, ddof 0) / ``accuracy_spread``
  (max - min): over the clients' accuracies (client-weighted);
* ``worst_client``: ``{"client", "accuracy"}`` of the lowest accuracy (ties: lowest id);
* ``worst10_mean``: mean accuracy of the worst ``max(1, M // 10)`` of the M clients with
  test nodes (``worst10_clients`` says how many);
* ``degree_quartiles``: the test nodes split at the 25/50/75 % quantiles ``q1 <= q2 <= q3``
  of their degrees (linear interpolation, as ``torch.quantile``): Q1 = ``[min, q1]``,
  Q2 = ``(q1, q2]``, Q3 = ``(q2, q3]``, Q4 = ``(q3, max]``; each with its ``lower`` /
  ``upper`` bound, a readable ``range``, ``test_nodes`` and ``accuracy`` (None if empty:
  with many equal degrees some quartiles hold no node);
* ``classes``: per class present among the test nodes, ``test_nodes`` and ``accuracy``;
* ``bytes_total`` / ``bytes_max`` over ``bytes_by_client`` (None without it).

:func:`fairness_markdown` renders the report as compact Markdown tables.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

_QUARTILES = ("Q1", "Q2", "Q3", "Q4")


def fairness_report(pred: Tensor, y: Tensor, test_mask: Tensor, owner: Tensor, degree: Tensor,
                    bytes_by_client: dict[int, int] | None = None) -> dict[str, Any]:
    """The fairness report described in the module docstring.

    The number of clients is ``owner.max() + 1`` (or more, if ``bytes_by_client`` names
    a higher id). Raises ValueError if the tensors' shapes disagree.
    """
    n = int(y.numel())
    if pred.dim() == 2:
        pred = pred.argmax(dim=1)
    for name, t in (("pred", pred), ("y", y), ("test_mask", test_mask), ("owner", owner),
                    ("degree", degree)):
        if t.dim() != 1 or t.numel() != n:
            raise ValueError(f"{name} must have shape [{n}] like y, got {list(t.shape)}")
    pred, y, owner = pred.cpu().long(), y.cpu().long(), owner.cpu().long()
    test_mask, degree = test_mask.cpu().bool(), degree.cpu()
    if n and int(owner.min()) < 0:
        raise ValueError("owner must hold client ids >= 0")
    k = int(owner.max()) + 1 if n else 0
    if bytes_by_client:
        k = max(k, max(int(c) for c in bytes_by_client) + 1)

    sel = test_mask & (y >= 0)
    hit = (pred == y) & sel
    tests = torch.bincount(owner[sel], minlength=k)
    hits = torch.bincount(owner[hit], minlength=k)
    clients = [{"client": c, "test_nodes": int(tests[c]),
                "accuracy": float(hits[c]) / int(tests[c]) if tests[c] > 0 else None,
                "bytes": None if bytes_by_client is None else bytes_by_client.get(c)}
               for c in range(k)]
    scored = [(row["accuracy"], row["client"]) for row in clients if row["accuracy"] is not None]
    report: dict[str, Any] = {
        "num_clients": k,
        "clients": clients,
        "clients_without_test": [row["client"] for row in clients if row["accuracy"] is None],
        "test_nodes": int(sel.sum()),
        "accuracy_overall": float(hit.sum()) / int(sel.sum()) if sel.any() else None,
    }
    report.update(_client_stats(scored))
    report["degree_quartiles"] = _by_degree(degree[sel], hit[sel])
    report["classes"] = _by_class(y[sel], hit[sel])
    if bytes_by_client:
        values = [int(v) for v in bytes_by_client.values()]
        report["bytes_total"], report["bytes_max"] = sum(values), max(values)
    else:
        report["bytes_total"] = report["bytes_max"] = None
    return report


def _client_stats(scored: list[tuple[float, int]]) -> dict[str, Any]:
    """Mean, std, spread, worst client and worst-10 % mean of ``(accuracy, client)`` pairs."""
    if not scored:
        return {"accuracy_mean": None, "accuracy_std": None, "accuracy_spread": None,
                "worst_client": None, "worst10_mean": None, "worst10_clients": 0}
    accs = [a for a, _ in scored]
    m = len(accs)
    mean = sum(accs) / m
    ranked = sorted(scored)  # lowest accuracy first, ties by client id
    worst = max(1, m // 10)
    return {
        "accuracy_mean": mean,
        "accuracy_std": math.sqrt(sum((a - mean) ** 2 for a in accs) / m),
        "accuracy_spread": max(accs) - min(accs),
        "worst_client": {"client": ranked[0][1], "accuracy": ranked[0][0]},
        "worst10_mean": sum(a for a, _ in ranked[:worst]) / worst,
        "worst10_clients": worst,
    }


def _by_degree(degree: Tensor, hit: Tensor) -> list[dict[str, Any]]:
    """Accuracy per degree quartile of the test nodes (``degree``, ``hit`` already selected)."""
    if degree.numel() == 0:
        return []
    d = degree.double()
    q = torch.quantile(d, torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64))
    # bucketize(right=False): bin i holds q[i-1] < d <= q[i], the (lower, upper] convention.
    bins = torch.bucketize(d, q)
    bounds = [float(d.min()), *q.tolist(), float(d.max())]
    rows = []
    for i, name in enumerate(_QUARTILES):
        inside = bins == i
        count = int(inside.sum())
        lo, hi = bounds[i], bounds[i + 1]
        rows.append({"quartile": name, "lower": lo, "upper": hi,
                     "range": f"{'[' if i == 0 else '('}{lo:g}, {hi:g}]",
                     "test_nodes": count,
                     "accuracy": float(hit[inside].sum()) / count if count else None})
    return rows


def _by_class(y: Tensor, hit: Tensor) -> list[dict[str, Any]]:
    if y.numel() == 0:
        return []
    size = int(y.max()) + 1
    tests = torch.bincount(y, minlength=size)
    hits = torch.bincount(y[hit], minlength=size)
    return [{"class": c, "test_nodes": int(tests[c]), "accuracy": float(hits[c]) / int(tests[c])}
            for c in range(size) if tests[c] > 0]


def _acc(value: float | None) -> str:
    return "no test nodes" if value is None else f"{value:.4f}"


def _bytes(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def fairness_markdown(report: dict[str, Any]) -> str:
    """``report`` (from :func:`fairness_report`) as Markdown: a summary table, then one
    table per client, degree quartile and class."""
    worst = report["worst_client"]
    worst_text = "-" if worst is None else f"{worst['client']} ({worst['accuracy']:.4f})"
    lines = [
        "| metric | value |", "|---|---|",
        f"| test accuracy (all test nodes) | {_acc(report['accuracy_overall'])} |",
        f"| client accuracy mean | {_acc(report['accuracy_mean'])} |",
        f"| client accuracy std | {_acc(report['accuracy_std'])} |",
        f"| client accuracy spread (max - min) | {_acc(report['accuracy_spread'])} |",
        f"| worst client | {worst_text} |",
        f"| mean of worst {report['worst10_clients']} client(s) (worst 10%) "
        f"| {_acc(report['worst10_mean'])} |",
    ]
    if report["clients_without_test"]:
        ids = ", ".join(str(c) for c in report["clients_without_test"])
        lines.append(f"| clients without test nodes | {ids} |")
    if report["bytes_total"] is not None:
        lines.append(f"| bytes total / max client | {_bytes(report['bytes_total'])} / "
                     f"{_bytes(report['bytes_max'])} |")
    lines += ["", "| client | test nodes | accuracy | bytes |", "|---:|---:|---:|---:|"]
    lines += [f"| {r['client']} | {r['test_nodes']} | {_acc(r['accuracy'])} | {_bytes(r['bytes'])} |"
              for r in report["clients"]]
    if report["degree_quartiles"]:
        lines += ["", "| degree quartile | degree | test nodes | accuracy |", "|---|---|---:|---:|"]
        lines += [f"| {r['quartile']} | {r['range']} | {r['test_nodes']} | {_acc(r['accuracy'])} |"
                  for r in report["degree_quartiles"]]
    if report["classes"]:
        lines += ["", "| class | test nodes | accuracy |", "|---:|---:|---:|"]
        lines += [f"| {r['class']} | {r['test_nodes']} | {_acc(r['accuracy'])} |"
                  for r in report["classes"]]
    return "\n".join(lines) + "\n"
