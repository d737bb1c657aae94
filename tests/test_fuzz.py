"""Property-based fuzzing (hypothesis) of what ``commgnn train`` accepts from users.

Inputs, valid and broken, generated at random:

* user graph files (``--dataset g.pt``): tensors of wrong shapes and dtypes, NaN/inf
  features, out-of-range or negative edge ids, bad masks and labels, missing keys,
  non-tensor values, other containers, and files that are no torch files at all;
* masks and labels alone, edited entry by entry (values, dtypes, lengths, [N, k] masks,
  dropped masks), with ``data.max_classes``, ``data.allow_mask_overlap`` and the split
  ratios from a config file;
* TOML configs: random subsets of the real keys of ``RunConfig`` (walked from the
  dataclasses, so new keys are fuzzed too) with values of the right and wrong types,
  unknown keys, and syntactically broken text;
* partition directories (``--partition-dir``) made by ``commgnn partition`` and then
  corrupted: files deleted, truncated or with flipped bytes, ``meta.json`` fields edited,
  part files re-saved with bad contents and a matching sha256;
* gossip topology files (``--gossip FILE``): edge lists, GraphML and GML, valid or not.

The property, for every input: ``main(["train", ...])`` either succeeds (return code 0,
the run directory holds ``summary.json`` and ``status.json`` with state ``complete``) or
returns 2 with exactly one line on stderr, ``commgnn: error: ...``, and leaves neither the
``--out`` directory nor a hidden staging sibling behind. No traceback, no exception out
of ``main``, no hang (per-test time-out).

Runs are in-process (``--parts 1``) on graphs of at most 40 nodes with a one-layer model
of width 4, so an example takes well under a second. The ``ci`` profile (derandomized,
so CI is reproducible) runs a few dozen examples per property; ``test_fuzz_long``
(marked ``slow``: ``pytest -m slow tests/test_fuzz.py``) runs the same properties with
the ``long`` profile (500 examples each, a fresh random seed every time). A failure
prints the falsifying case and a ``@reproduce_failure`` blob.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import math
import shutil
import string
import tempfile
import types
import typing
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Union, get_args, get_origin

import pytest
import tomli_w
import torch
from hypothesis import HealthCheck, Phase, currently_in_test_context, event, given, settings
from hypothesis import note as _note
from hypothesis import strategies as st
from torch import Tensor

from commgnn.cli.config import RunConfig
from commgnn.cli.main import main

# --------------------------------------------------------------------------- profiles

_PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink]  # no slow "explain"
_SUPPRESS = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
             HealthCheck.data_too_large, HealthCheck.filter_too_much]
settings.register_profile("ci", max_examples=40, deadline=None, derandomize=True, database=None,
                          print_blob=True, suppress_health_check=_SUPPRESS, phases=_PHASES)
settings.register_profile("long", max_examples=500, deadline=None, derandomize=False, database=None,
                          print_blob=True, suppress_health_check=_SUPPRESS, phases=_PHASES)
CI = settings.get_profile("ci")
LONG = settings.get_profile("long")

# --------------------------------------------------------------------------- harness

SMALL = ("--epochs", "1", "--hidden", "4", "--layers", "1", "--threads", "1")
"""Flags that keep a run tiny; a config case drops the ones its file sets itself."""


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Relative paths in fuzzed configs resolve inside tmp_path; no torchrun or data-root
    variables from the caller's shell leak into the runs."""
    monkeypatch.chdir(tmp_path)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_RESTART_COUNT", "COMMGNN_DATA_ROOT"):
        monkeypatch.delenv(var, raising=False)


def note(text: str) -> None:
    """hypothesis.note inside a hypothesis example; nothing in a plain test."""
    if currently_in_test_context():
        _note(text)


def _event(text: str) -> None:
    if currently_in_test_context():
        event(text)


def _kind(err: str) -> str:
    """The start of an error line, for the outcome statistics (--hypothesis-show-statistics)."""
    words = err.removeprefix("commgnn: error:").split()
    return " ".join(w for w in words[:4] if "/" not in w)


class Harness:
    """Runs ``commgnn train`` in-process in a fresh workspace per example and checks the
    outcome property. A workspace is ``<root>/wsN/`` with ``in/`` (the inputs) and
    ``out/`` (the parent of the run directory ``out/run``, watched for staging leftovers)."""

    def __init__(self, cap: Any, root: Path) -> None:
        self.cap, self.root = cap, root

    @contextlib.contextmanager
    def workspace(self) -> typing.Iterator[Path]:
        ws = Path(tempfile.mkdtemp(prefix="ws", dir=self.root))
        (ws / "in").mkdir()
        (ws / "out").mkdir()
        try:
            yield ws
        finally:
            shutil.rmtree(ws, ignore_errors=True)

    def train(self, ws: Path, *args: str, small: tuple[str, ...] = SMALL) -> tuple[int, str]:
        """Run ``commgnn train ARGS`` (with --quiet, --out and the SMALL flags), check the
        property, return ``(rc, stderr)``."""
        out = ws / "out" / "run"
        argv = ["train", *args, *small, "--quiet", "--out", str(out)]
        note(f"argv: {argv}")
        self.cap.readouterr()
        with warnings.catch_warnings(record=True) as caught:
            # What `python -m commgnn` would print: Python's default filters (deprecations
            # hidden), each warning once. pytest would otherwise swallow them.
            warnings.simplefilter("always")
            for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
                warnings.filterwarnings("ignore", category=category)
            try:
                rc = main(argv)
            except SystemExit as exc:  # argparse's usage errors exit 2 (after one line)
                rc = exc.code
        err = self.cap.readouterr().err
        shown = {warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line) for w in caught}
        err = "".join(sorted(shown)) + err  # printed before the error line
        note(f"rc={rc} stderr={err!r}")
        _event(f"rc={rc} {_kind(err) if rc else ''}")
        check_outcome(rc, err, out)
        return rc, err


def check_outcome(rc: Any, err: str, out: Path) -> None:
    """The property: success with a complete run directory, or exit 2 with one error line
    and nothing left behind."""
    assert "Traceback" not in err, err
    leftovers = sorted(p.name for p in out.parent.iterdir() if p.name != out.name)
    assert not leftovers, f"staging leftovers next to --out: {leftovers}"
    if rc == 0:
        status = json.loads((out / "status.json").read_text())
        assert status["state"] == "complete", status
        assert (out / "summary.json").is_file()
        return
    assert rc == 2, f"exit code {rc!r}, stderr {err!r}"
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("commgnn: error:"), f"stderr is not one error line: {err!r}"
    assert not out.exists(), f"{out} left behind after an error: {sorted(p.name for p in out.iterdir())}"


# --------------------------------------------------------------------------- graphs

KEYS = ("x", "edge_index", "y", "train_mask", "val_mask", "test_mask")
MASKS = ("train_mask", "val_mask", "test_mask")
I64 = (-2**63, 2**63 - 1)
NON_TENSORS = st.sampled_from([None, 0, 3, -1, 1.5, float("nan"), True, "x", b"\x00", [1, 2], [[0, 1]],
                               {"a": 1}, (1,), [0.5] * 3])


@dataclass(frozen=True)
class GraphSpec:
    """A valid small graph, built deterministically from these numbers."""

    n: int
    f: int
    c: int
    e: int
    seed: int
    unlabelled: int = 0
    """Nodes (outside every mask) with label -1."""


def build_graph(s: GraphSpec) -> dict[str, Any]:
    g = torch.Generator().manual_seed(s.seed)
    x = torch.randn(s.n, s.f, generator=g)
    ei = torch.randint(0, s.n, (2, s.e), generator=g)
    y = torch.randint(0, s.c, (s.n,), generator=g)
    perm = torch.randperm(s.n, generator=g)
    k_un = min(s.unlabelled, s.n - 3)
    labelled = perm[k_un:]
    y[perm[:k_un]] = -1
    m = labelled.numel()
    k1 = max(1, m // 2)
    k2 = max(1, (m - k1) // 2)
    masks = [torch.zeros(s.n, dtype=torch.bool) for _ in range(3)]
    masks[0][labelled[:k1]] = True
    masks[1][labelled[k1:k1 + k2]] = True
    masks[2][labelled[k1 + k2:]] = True
    return {"x": x, "edge_index": ei, "y": y, **dict(zip(MASKS, masks))}


graph_specs = st.builds(GraphSpec, n=st.integers(3, 40), f=st.integers(1, 5), c=st.integers(1, 4),
                        e=st.integers(0, 80), seed=st.integers(0, 2**31 - 1),
                        unlabelled=st.sampled_from([0, 0, 0, 1, 3]))


def _as_float(t: Tensor) -> Tensor:
    return t if t.dtype.is_floating_point else t.double()


def _pick(t: Tensor, i: int) -> int:
    return i % t.numel()


DTYPES = {"float16": torch.float16, "float32": torch.float32, "float64": torch.float64,
          "bfloat16": torch.bfloat16, "int8": torch.int8, "uint8": torch.uint8, "int16": torch.int16,
          "int32": torch.int32, "int64": torch.int64, "bool": torch.bool, "complex64": torch.complex64}

# Each mutation: name -> (strategy of its parameters, function(obj, n, *params)). The
# function edits the graph dict in place and skips what is no longer there to edit.
Mutation = tuple[st.SearchStrategy, Callable[..., None]]


def _get(obj: dict, key: str) -> Tensor | None:
    t = obj.get(key)
    return t if isinstance(t, Tensor) else None


def mut_drop(obj: dict, n: int, key: str) -> None:
    obj.pop(key, None)


def mut_non_tensor(obj: dict, n: int, key: str, value: Any) -> None:
    obj[key] = value


def mut_dtype(obj: dict, n: int, key: str, dtype: str) -> None:
    t = _get(obj, key)
    if t is not None:
        obj[key] = t.to(DTYPES[dtype])


def mut_shape(obj: dict, n: int, key: str, kind: str) -> None:
    t = _get(obj, key)
    if t is None:
        return
    if kind == "drop_first":
        t = t[1:]
    elif kind == "drop_last_dim_entry" and t.dim() >= 1:
        t = t[..., :-1]
    elif kind == "extra_row":
        t = torch.cat([t, t[:1]]) if t.dim() and t.size(0) else t
    elif kind == "flatten":
        t = t.reshape(-1)
    elif kind == "unsqueeze":
        t = t.unsqueeze(0)
    elif kind == "transpose" and t.dim() == 2:
        t = t.t()
    elif kind == "column":
        t = t.reshape(-1, 1)
    elif kind == "wide":  # [N, 2] masks are valid (column 0 is used); for others a shape error
        t = torch.stack([t, t], dim=-1)
    elif kind == "scalar":
        t = t.reshape(-1)[0] if t.numel() else torch.tensor(0, dtype=t.dtype)
    elif kind == "empty":
        t = t[:0]
    elif kind == "no_features" and t.dim() == 2:
        t = t[:, :0]
    obj[key] = t


def mut_x_value(obj: dict, n: int, i: int, value: float) -> None:
    x = _get(obj, "x")
    if x is None or not x.numel() or x.is_complex():
        return
    x = _as_float(x).clone()
    x.view(-1)[_pick(x, i)] = value
    obj["x"] = x


def mut_int_value(obj: dict, n: int, key: str, i: int, value: str | int) -> None:
    t = _get(obj, key)
    if t is None or not t.numel() or t.dtype.is_floating_point or t.is_complex() or t.dtype == torch.bool:
        return
    v = {"n": n, "n+1": n + 1, "-1": -1, "2n": 2 * n, "big": 2**40, "min": I64[0], "max": I64[1]}.get(value, value)
    t = t.long().clone()
    t.view(-1)[_pick(t, i)] = int(v)
    obj[key] = t


def mut_mask_value(obj: dict, n: int, key: str, dtype: str, i: int, value: int | float) -> None:
    t = _get(obj, key)
    if t is None or not t.numel():
        return
    t = t.to(DTYPES[dtype]).clone()
    t.view(-1)[_pick(t, i)] = value
    obj[key] = t


def mut_overlap(obj: dict, n: int, a: str, b: str, i: int) -> None:
    ta, tb = _get(obj, a), _get(obj, b)
    if ta is None or tb is None or ta.dtype != torch.bool or tb.shape != ta.shape or not ta.any():
        return
    node = ta.nonzero().view(-1)[i % int(ta.sum())]
    tb = tb.clone()
    tb[node] = True
    obj[b] = tb


def mut_empty_mask(obj: dict, n: int, key: str) -> None:
    t = _get(obj, key)
    if t is not None:
        obj[key] = torch.zeros_like(t)


def mut_unlabelled_in_mask(obj: dict, n: int, key: str) -> None:
    t, y = _get(obj, key), _get(obj, "y")
    if t is None or y is None or t.dtype != torch.bool or t.shape != y.shape or not t.any():
        return
    y = y.clone()
    y[t.nonzero()[0, 0]] = -1
    obj["y"] = y


def mut_num_classes(obj: dict, n: int, value: Any) -> None:
    obj["num_classes"] = value


def mut_sparse_x(obj: dict, n: int) -> None:
    x = _get(obj, "x")
    if x is not None and x.dim() == 2 and x.layout == torch.strided:
        obj["x"] = x.to_sparse()


def mut_exotic(obj: dict, n: int, key: str, kind: str) -> None:
    """A tensor of a kind torch can save but that holds no plain values (or odd strides)."""
    t = _get(obj, key)
    if t is None:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if kind == "meta":
            t = torch.empty(t.shape, dtype=t.dtype, device="meta")
        elif kind == "quantized":
            t = torch.quantize_per_tensor(t.float(), 0.1, 0, torch.qint8)
        elif kind == "nested":
            t = torch.nested.nested_tensor([t.float(), t.float()[:1]])
        elif kind == "parameter":
            t = torch.nn.Parameter(t.float(), requires_grad=t.dtype.is_floating_point)
        elif kind == "noncontiguous" and t.dim() == 2:
            t = t.t().contiguous().t()
        elif kind == "expanded" and t.dim() >= 1 and t.numel():
            t = t[:1].expand(t.shape)
    obj[key] = t


def mut_extra_key(obj: dict, n: int, key: str, value: Any) -> None:
    obj[key] = value


MUTATIONS: dict[str, Mutation] = {
    "drop": (st.tuples(st.sampled_from(KEYS)), mut_drop),
    "non_tensor": (st.tuples(st.sampled_from(KEYS), NON_TENSORS), mut_non_tensor),
    "dtype": (st.tuples(st.sampled_from(KEYS), st.sampled_from(sorted(DTYPES))), mut_dtype),
    "shape": (st.tuples(st.sampled_from(KEYS),
                        st.sampled_from(["drop_first", "drop_last_dim_entry", "extra_row", "flatten",
                                         "unsqueeze", "transpose", "column", "wide", "scalar", "empty",
                                         "no_features"])), mut_shape),
    "x_value": (st.tuples(st.integers(0, 10**6),
                          st.sampled_from([math.nan, math.inf, -math.inf, 1e38, -0.0, 1e-45])), mut_x_value),
    "int_value": (st.tuples(st.sampled_from(["edge_index", "y"]), st.integers(0, 10**6),
                            st.sampled_from(["n", "n+1", "-1", "2n", "big", "min", "max", 0, 999, 1000, -2])),
                  mut_int_value),
    "mask_value": (st.tuples(st.sampled_from(MASKS), st.sampled_from(["uint8", "int64", "int8", "float32", "bool"]),
                             st.integers(0, 10**6), st.sampled_from([0, 1, 2, -1, 255])), mut_mask_value),
    "overlap": (st.tuples(st.sampled_from(MASKS), st.sampled_from(MASKS), st.integers(0, 100)), mut_overlap),
    "empty_mask": (st.tuples(st.sampled_from(MASKS)), mut_empty_mask),
    "unlabelled_in_mask": (st.tuples(st.sampled_from(MASKS)), mut_unlabelled_in_mask),
    "num_classes": (st.tuples(st.one_of(st.sampled_from([0, 1, 2, 5, 999, 1000, 1001, 10**9, -1, I64[1]]),
                                        NON_TENSORS, st.just(torch.tensor(3)), st.just(torch.tensor([2, 3])))),
                    mut_num_classes),
    "sparse_x": (st.tuples(), mut_sparse_x),
    "exotic": (st.tuples(st.sampled_from(KEYS), st.sampled_from(["meta", "quantized", "nested", "parameter",
                                                                  "noncontiguous", "expanded"])), mut_exotic),
    "extra_key": (st.tuples(st.sampled_from(["edge_attr", "pos", "foo", "num_nodes"]),
                            st.one_of(NON_TENSORS, st.just(torch.zeros(2)))), mut_extra_key),
}

CONTAINERS = ("dict", "dict", "dict", "Data", "list", "tensor", "int", "str", "none", "tuple")
RAW = ("empty", "text", "bytes", "truncated", "flipped", "zip", "pickle_head", "directory", "appended")


@dataclass(frozen=True)
class GraphCase:
    spec: GraphSpec
    mutations: tuple[tuple[str, tuple], ...]
    container: str = "dict"
    raw: str | None = None
    """A file-level corruption (RAW) applied to the saved file instead."""
    raw_arg: Any = None


@st.composite
def graph_cases(draw: Callable) -> GraphCase:
    spec = draw(graph_specs)
    names = draw(st.lists(st.sampled_from(sorted(MUTATIONS)), max_size=3))
    muts = tuple((name, draw(MUTATIONS[name][0])) for name in names)
    container = draw(st.sampled_from(CONTAINERS)) if draw(st.integers(0, 9)) == 0 else "dict"
    raw = draw(st.sampled_from(RAW)) if draw(st.integers(0, 5)) == 0 else None
    raw_arg = None
    if raw in ("text", "bytes", "appended"):
        raw_arg = draw(st.text(max_size=40)) if raw == "text" else draw(st.binary(max_size=64))
    elif raw in ("truncated", "flipped"):
        raw_arg = draw(st.lists(st.integers(0, 10**6), min_size=1, max_size=3))
    return GraphCase(spec=spec, mutations=muts, container=container, raw=raw, raw_arg=raw_arg)


def graph_object(case: GraphCase) -> Any:
    obj = build_graph(case.spec)
    for name, params in case.mutations:
        try:
            MUTATIONS[name][1](obj, case.spec.n, *params)
        except (RuntimeError, NotImplementedError, ValueError, IndexError, TypeError):
            pass  # not applicable to what earlier mutations made (a sparse x, an int8 overflow, ...)
    c = case.container
    if c == "Data":
        from torch_geometric.data import Data
        return Data(**{k: v for k, v in obj.items() if isinstance(v, Tensor)})
    return {"dict": obj, "list": list(obj.values()), "tensor": obj.get("x"), "int": 7, "str": "graph",
            "none": None, "tuple": tuple(obj.items())}[c]


def write_graph_file(case: GraphCase, path: Path) -> None:
    raw = case.raw
    if raw == "directory":
        path.mkdir()
        return
    if raw == "empty":
        path.write_bytes(b"")
        return
    if raw == "text":
        path.write_text(case.raw_arg)
        return
    if raw == "bytes":
        path.write_bytes(case.raw_arg)
        return
    if raw == "zip":
        import zipfile
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("archive/data.pkl", b"\x80\x02garbage")
        return
    if raw == "pickle_head":
        path.write_bytes(b"\x80\x04\x95" + bytes(range(40)))
        return
    torch.save(graph_object(case), path)
    blob = bytearray(path.read_bytes())
    if raw == "truncated":
        path.write_bytes(bytes(blob[: case.raw_arg[0] % max(1, len(blob))]))
    elif raw == "flipped":
        for i in case.raw_arg:
            blob[i % len(blob)] ^= 0xFF
        path.write_bytes(bytes(blob))
    elif raw == "appended":
        path.write_bytes(bytes(blob) + case.raw_arg)


def prop_graph_file(h: Harness, case: GraphCase) -> None:
    with h.workspace() as ws:
        path = ws / "in" / "g.pt"
        write_graph_file(case, path)
        h.train(ws, "--dataset", str(path), "--parts", "1")


# --------------------------------------------------------------------------- masks and labels

MASK_DTYPES = ("bool", "bool", "uint8", "int64", "int8", "int32", "float32")


@dataclass(frozen=True)
class LabelCase:
    """A valid graph whose labels and masks are then edited entry by entry."""

    spec: GraphSpec
    y_edits: tuple[tuple[int, int], ...]
    """(node, label) assignments."""
    mask_edits: tuple[tuple[str, int, int], ...]
    """(mask, node, value) assignments (values other than 0/1 turn the mask into int64)."""
    mask_forms: tuple[tuple[str, str, int], ...]
    """(mask, dtype, width): converted to ``dtype``; width > 0 stacks it into ``[N, width]``."""
    lengths: tuple[tuple[str, int], ...]
    """(field, delta): y or a mask made longer (delta > 0) or shorter."""
    dropped: tuple[str, ...]
    """Masks left out (all three: a generated stratified split)."""
    num_classes: Any
    max_classes: int | None
    allow_overlap: bool | None
    ratios: tuple[float, float] | None


LABELS = st.one_of(st.integers(-2, 5), st.sampled_from([-1, 999, 1000, 10**6, 2**40, I64[0], I64[1]]))
FIELDS = ("y", *MASKS)


@st.composite
def label_cases(draw: Callable) -> LabelCase:
    spec = draw(st.builds(GraphSpec, n=st.integers(3, 40), f=st.integers(1, 3), c=st.integers(1, 4),
                          e=st.integers(0, 60), seed=st.integers(0, 2**31 - 1),
                          unlabelled=st.sampled_from([0, 0, 2])))
    node = st.integers(0, spec.n - 1)
    y_edits = tuple(draw(st.lists(st.tuples(node, LABELS), max_size=3)))
    mask_edits = tuple(draw(st.lists(st.tuples(st.sampled_from(MASKS), node,
                                               st.sampled_from([0, 1, 1, 2, -1])), max_size=4)))
    mask_forms = tuple(draw(st.lists(st.tuples(st.sampled_from(MASKS), st.sampled_from(MASK_DTYPES),
                                               st.sampled_from([0, 0, 0, 1, 2])), max_size=1)))
    lengths = ()
    if draw(st.integers(0, 7)) == 0:
        lengths = ((draw(st.sampled_from(FIELDS)), draw(st.sampled_from([-1, 1, 2, -spec.n]))),)
    dropped = tuple(draw(st.sampled_from([()] * 8 + [("val_mask",), MASKS, MASKS])))
    num_classes = draw(st.one_of(st.none(), st.none(), st.integers(-1, 8),
                                 st.sampled_from([10**6, I64[1], 2**70, 2.5, "3", True, None])))
    max_classes = draw(st.none() | st.none() | st.integers(-1, 8) | st.sampled_from([1000, I64[1]]))
    allow = draw(st.none() | st.booleans())
    ratios = draw(st.one_of(st.none(), st.sampled_from([(0.6, 0.2), (0.34, 0.33), (0.1, 0.1), (0.9, 0.05)]),
                            st.tuples(st.floats(0, 1), st.floats(0, 1))))
    return LabelCase(spec=spec, y_edits=y_edits, mask_edits=mask_edits, mask_forms=mask_forms, lengths=lengths,
                     dropped=dropped, num_classes=num_classes, max_classes=max_classes, allow_overlap=allow,
                     ratios=ratios)


def _resized(t: Tensor, delta: int) -> Tensor:
    if delta < 0:
        return t[:max(0, t.size(0) + delta)]
    return torch.cat([t, t[:1].expand(delta, *t.shape[1:])])


def prop_masks_labels(h: Harness, case: LabelCase) -> None:
    obj = build_graph(case.spec)
    y = obj["y"]
    for i, v in case.y_edits:
        y[i] = v
    for name, i, v in case.mask_edits:
        if v not in (0, 1):
            obj[name] = obj[name].long()
        obj[name][i] = v
    for name, dtype, width in case.mask_forms:
        t = obj[name].to(DTYPES[dtype])
        obj[name] = torch.stack([t] * width, dim=1) if width else t
    for name, delta in case.lengths:
        obj[name] = _resized(obj[name], delta)
    for name in case.dropped:
        del obj[name]
    if case.num_classes is not None:
        obj["num_classes"] = case.num_classes
    data: dict[str, Any] = {}
    if case.max_classes is not None:
        data["max_classes"] = case.max_classes
    if case.allow_overlap is not None:
        data["allow_mask_overlap"] = case.allow_overlap
    if case.ratios is not None:
        data["train_ratio"], data["val_ratio"] = case.ratios
    with h.workspace() as ws:
        path = ws / "in" / "g.pt"
        torch.save(obj, path)
        args = ["--dataset", str(path), "--parts", "1"]
        if data:
            (ws / "in" / "c.toml").write_text(tomli_w.dumps({"data": data}))
            args += ["--config", str(ws / "in" / "c.toml")]
        h.train(ws, *args)


# --------------------------------------------------------------------------- configs

SECTIONS_SKIPPED = {"fault"}
"""``[fault]`` injects failures on purpose (SIGKILL/SIGSTOP of the rank: in-process, of
pytest itself); it is not user input to fuzz."""

GRAPH = "@GRAPH@"
"""Stands for the test graph's path in generated configs (filled in at run time)."""


def _registered(name: str) -> bool:
    from commgnn.data.datasets import resolve_dataset
    from commgnn.errors import ConfigError
    if name.strip().lower() == "synthetic":
        return True
    try:
        resolve_dataset(name)
    except ConfigError:
        return False
    return True


SAFE: dict[str, st.SearchStrategy] = {
    # Keys that set a run's cost: fuzzed only within a tiny range (wrong types are drawn as
    # for any key). The file's value is used: the matching SMALL flag is then left out.
    "train.epochs": st.integers(-2, 2),
    "model.hidden": st.integers(-1, 8),
    "model.layers": st.integers(-1, 3),
    "model.heads": st.integers(-1, 4),
    "runtime.threads": st.integers(-1, 2),
    "runtime.parts": st.integers(-1, 1),
    # The dataset: the test graph, missing files, odd names; never a registered dataset
    # name (without a data root that would start a download) nor "synthetic" (20000 nodes).
    "data.dataset": st.one_of(st.just(GRAPH), st.just(GRAPH), st.sampled_from(["missing.pt", "", " ", "a\nb.pt",
                                                                             "dir.pt", "."]),
                              st.text(max_size=10).filter(lambda t: not _registered(t))),
}
SAFE_FLAGS = {"train.epochs": ("--epochs", "1"), "model.hidden": ("--hidden", "4"), "model.layers": ("--layers", "1"),
              "runtime.threads": ("--threads", "1"), "data.dataset": ("--dataset", GRAPH)}

WORDS = ["", " ", "auto", "gloo", "nccl", "cpu", "cuda", "metis", "random", "contiguous", "cut", "vol", "gcn",
         "sage", "gat", "adam", "sgd", "constant", "cosine", "float32", "float64", "on", "off", "none",
         "pipeline", "skip", "adaptive", "ring", "torus", "exponential", "full", "dpsgd", "dpsgd-atc",
         "pushsum", "tracking", "tracking-atc", "allreduce", "fp16", "bf16", "powersgd", "localsgd", "topk",
         "cltk", "qsgd", "signsgd", ".", "/", "..", "\x00", "a\nb", "synthetic", "Cora", "x.pt", "~"]
TOML_INT = st.one_of(st.integers(-3, 12), st.sampled_from([0, -1, 100, 2**31, 2**53 + 1, I64[0], I64[1], 2**64,
                                                           10**30, -10**30]))
TOML_FLOAT = st.one_of(st.floats(), st.sampled_from([0.0, -0.0, 0.5, 1.0, 1e-300, 1e300, math.nan,
                                                     math.inf, -math.inf, 0.999999]))
TOML_STR = st.one_of(st.sampled_from(WORDS), st.text(max_size=10))
TOML_KEY = st.text(alphabet=string.ascii_letters + string.digits + "_-", min_size=1, max_size=8)
TOML_SCALAR = st.one_of(TOML_INT, TOML_FLOAT, TOML_STR, st.booleans(),
                        st.dates(), st.datetimes(timezones=st.none() | st.timezones()))
TOML_VALUE = st.recursive(TOML_SCALAR, lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(TOML_KEY, inner, max_size=3), max_leaves=5)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _typed(hint: Any, path: str) -> st.SearchStrategy:
    """Values of the right type for ``hint`` (ranges unconstrained)."""
    origin = get_origin(hint)
    if hint is bool:
        return st.booleans()
    if hint is int:
        return TOML_INT
    if hint is float:
        return st.one_of(TOML_FLOAT, TOML_INT)
    if hint is str:
        return TOML_STR
    if origin is Literal:
        return st.one_of(st.sampled_from(get_args(hint)), st.sampled_from(get_args(hint)), TOML_STR)
    if origin in (Union, types.UnionType):
        return st.one_of([_value(a, path) for a in get_args(hint) if a is not type(None)])
    if dataclasses.is_dataclass(hint):
        return _table(hint, path)
    return TOML_VALUE


def _value(hint: Any, path: str) -> st.SearchStrategy:
    """A value for key ``path``: mostly of the right type, sometimes anything at all."""
    if path in SAFE:
        wrong = TOML_VALUE.filter(lambda v: not _is_int(v))  # (and _guard in prop_config)
        return st.one_of(SAFE[path], SAFE[path], wrong)
    return st.one_of(_typed(hint, path), _typed(hint, path), TOML_VALUE)


def _table(cls: type, path: str) -> st.SearchStrategy:
    """A table of ``cls``: a random subset of its keys."""
    hints = typing.get_type_hints(cls)
    optional = {f.name: _value(hints[f.name], f"{path}.{f.name}") for f in dataclasses.fields(cls) if f.init}
    return st.fixed_dictionaries({}, optional=optional)


def _keys(cls: type, path: str = "") -> list[tuple[str, Any]]:
    """Every config key under ``cls`` as ``(dotted path, type hint)``; a table (such as
    ``comm.halo``) is listed itself (so it can be given a wrong value) and by its keys."""
    out: list[tuple[str, Any]] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{path}.{f.name}" if path else f.name
        if not f.init or key in SECTIONS_SKIPPED:
            continue
        hint = hints[f.name]
        arms = [a for a in get_args(hint) if a is not type(None)] if get_origin(hint) in (Union, types.UnionType) \
            else [hint]
        out.append((key, hint))
        if len(arms) == 1 and dataclasses.is_dataclass(arms[0]):
            out += _keys(arms[0], key)
    return out


CONFIG_KEYS = _keys(RunConfig)


@st.composite
def config_trees(draw: Callable) -> dict:
    """A few keys (mostly leaves) with values; tables are built on the way."""
    chosen = draw(st.lists(st.sampled_from(CONFIG_KEYS), max_size=6, unique_by=lambda kv: kv[0]))
    tree: dict = {}
    for key, hint in chosen:
        *heads, leaf = key.split(".")
        table = tree
        for head in heads:
            if not isinstance(table.get(head), dict):
                table[head] = {}
            table = table[head]
        if not isinstance(table.get(leaf), dict):  # a table listed before one of its keys stays a table
            table[leaf] = draw(_value(hint, key))
    return tree


TEXT_EDITS = ("insert", "delete", "duplicate_line", "truncate", "replace", "bytes", "bom", "unterminated",
              "header_twice", "deep")


@dataclass(frozen=True)
class ConfigCase:
    tree: dict
    unknown: tuple[tuple[int, str, Any], ...]
    edit: tuple[str, int, Any] | None


@st.composite
def config_cases(draw: Callable) -> ConfigCase:
    tree = draw(config_trees())
    unknown = tuple(draw(st.lists(st.tuples(st.integers(0, 50), TOML_KEY, TOML_VALUE), max_size=1))
                    if draw(st.integers(0, 4)) == 0 else [])
    edit = None
    if draw(st.integers(0, 4)) == 0:
        kind = draw(st.sampled_from(TEXT_EDITS))
        edit = (kind, draw(st.integers(0, 10**6)),
                draw(st.binary(max_size=20)) if kind == "bytes" else draw(st.text(max_size=20)))
    return ConfigCase(tree=tree, unknown=unknown, edit=edit)


def _tables(tree: dict, prefix: tuple = ()) -> list[tuple[str, ...]]:
    out = [prefix]
    for k, v in tree.items():
        if isinstance(v, dict):
            out += _tables(v, prefix + (k,))
    return out


def config_text(case: ConfigCase) -> bytes:
    tree = _copy(case.tree)
    for where, key, value in case.unknown:
        tables = _tables(tree)
        table = tree
        for k in tables[where % len(tables)]:
            table = table[k]
        table[f"zz_{key}"] = value  # no real key starts with zz_
    text = tomli_w.dumps(tree).encode()
    if case.edit is None:
        return text
    kind, pos, arg = case.edit
    i = pos % (len(text) + 1)
    if kind == "insert":
        return text[:i] + str(arg).encode() + text[i:]
    if kind == "delete":
        return text[:i] + text[i + 1 + pos % 7:]
    if kind == "duplicate_line":
        lines = text.splitlines(keepends=True) or [b"a = 1\n"]
        j = pos % len(lines)
        return b"".join(lines[:j + 1] + [lines[j]] + lines[j + 1:])
    if kind == "truncate":
        return text[:i]
    if kind == "replace":
        return str(arg).encode()
    if kind == "bytes":
        return text[:i] + arg + text[i:]
    if kind == "bom":
        return b"\xff\xfe" + text
    if kind == "unterminated":
        return text + b'\nzz = "abc\n'
    if kind == "header_twice":
        return text + b"\n[model]\n[model]\n"
    return text + b"\nzz = " + b"[" * (200 + pos % 5000) + b"\n"  # deep


def _copy(tree: Any) -> Any:
    return {k: _copy(v) for k, v in tree.items()} if isinstance(tree, dict) else tree


def _has(tree: dict, dotted: str) -> bool:
    for k in dotted.split("."):
        if not isinstance(tree, dict) or k not in tree:
            return False
        tree = tree[k]
    return True


def _fill(value: Any, graph: str) -> Any:
    if isinstance(value, dict):
        return {k: _fill(v, graph) for k, v in value.items()}
    return graph if value == GRAPH else value


SAFE_INTS = {"train.epochs": 2, "model.hidden": 8, "model.layers": 3, "model.heads": 4, "runtime.threads": 2,
             "runtime.parts": 1}


def _guard(tree: Any, path: str = "") -> Any:
    """The SAFE limits also where a wrong-typed table happens to spell a real key (a random
    ``runtime = {threads = 10**6}`` would start a million threads in this process)."""
    if not isinstance(tree, dict):
        return tree
    out = {}
    for k, v in tree.items():
        key = f"{path}.{k}" if path else k
        if key in SAFE_INTS and _is_int(v) and v > SAFE_INTS[key]:
            v = SAFE_INTS[key]
        elif key == "data.dataset" and isinstance(v, str) and _registered(v):
            v = GRAPH
        out[k] = _guard(v, key)
    return out


def prop_config(h: Harness, graph: Path, case: ConfigCase) -> None:
    case = dataclasses.replace(case, tree=_guard(case.tree))
    small: list[str] = []
    for key, (flag, value) in SAFE_FLAGS.items():
        # Edited text could turn `threads = 1` into `threads = 19999`: flags then win.
        if case.edit is not None or not _has(case.tree, key):
            small += [flag, str(graph) if value == GRAPH else value]
    case = dataclasses.replace(case, tree=_fill(case.tree, str(graph)))
    with h.workspace() as ws:
        path = ws / "in" / "c.toml"
        path.write_bytes(config_text(case))
        note(f"config:\n{path.read_bytes()!r}")
        h.train(ws, "--config", str(path), "--parts", "1", small=tuple(small))


# --------------------------------------------------------------------------- partition dirs

META_FIELDS = ("format", "version", "num_parts", "num_nodes", "num_edges", "num_features", "num_classes",
               "graph_fingerprint", "files",
               "method", "objective", "seed", "report", "dataset")
REPORT_FIELDS = ("nodes", "halo_in", "halo_out", "edges", "train_nodes", "edge_cut", "comm_volume",
                 "max_rank_halo", "num_parts")
JSON_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-3, 50), st.sampled_from([I64[1], 2**70]),
                        st.floats(), st.text(max_size=8), st.sampled_from(["metis", "random", "cut", "vol"]))
JSON_VALUE = st.recursive(JSON_SCALAR,
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                      max_size=3),
                          max_leaves=5)
PART_FILES = ("meta.json", "part_0.pt")
CORRUPTIONS = ("delete", "truncate", "flip", "append", "edit_meta", "drop_meta_key", "edit_report",
               "meta_not_dict", "meta_is_dir", "dir_is_file", "extra_file", "forge_part")


@st.composite
def corruptions(draw: Callable) -> tuple:
    kind = draw(st.sampled_from(CORRUPTIONS))
    if kind in ("delete", "truncate", "flip", "append"):
        return (kind, draw(st.sampled_from(PART_FILES)), draw(st.lists(st.integers(0, 10**6), min_size=1,
                                                                          max_size=3)))
    if kind == "edit_meta":
        return (kind, draw(st.sampled_from(META_FIELDS)), draw(JSON_VALUE))
    if kind == "drop_meta_key":
        return (kind, draw(st.sampled_from(META_FIELDS)))
    if kind == "edit_report":
        return (kind, draw(st.sampled_from(REPORT_FIELDS)), draw(JSON_VALUE | st.lists(st.integers(-2, 30),
                                                                                        max_size=3)))
    if kind == "meta_not_dict":
        return (kind, draw(JSON_SCALAR | st.lists(JSON_VALUE, max_size=3)))
    if kind == "forge_part":
        return (kind, draw(st.sampled_from(FORGE_KEYS)), draw(st.sampled_from(FORGES)))
    return (kind,)


FORGE_KEYS = ("rank", "num_parts", "num_nodes_global", "num_classes", "recv_counts", "send_counts", "global_ids",
              "halo_global_ids", "send_index", "edge_index", "in_degree", "x", "y", "train_mask", "val_mask",
              "test_mask")
FORGES = ("drop", "none", "zero", "negative", "big", "float", "bool", "shorter", "longer", "nan", "transpose")


def forge_value(v: Any, how: str) -> Any:
    """A changed payload value (the part file is re-saved and its sha256 updated, so only the
    loader's consistency checks stand between it and the trainer)."""
    if how == "none":
        return None
    if isinstance(v, Tensor):
        if how == "zero":
            return torch.zeros_like(v)
        if how == "negative":
            return -v - 1 if v.dtype != torch.bool else v
        if how == "big":
            return v * 1000 + 10**6 if v.dtype != torch.bool else v
        if how == "float":
            return v.double()
        if how == "bool":
            return v.bool()
        if how == "shorter":
            return v[..., :-1] if v.dim() else v
        if how == "longer":
            return torch.cat([v, v[..., :1]], dim=-1) if v.dim() and v.numel() else v
        if how == "nan":
            return _as_float(v).clone().fill_(math.nan)
        if how == "transpose":
            return v.t() if v.dim() == 2 else v.unsqueeze(0)
        return v
    if isinstance(v, list):
        return {"zero": [0] * len(v), "negative": [-1] * len(v), "big": [10**6] * len(v),
                "float": [float(c) for c in v], "bool": [bool(c) for c in v], "shorter": v[:-1],
                "longer": v + [0]}.get(how, v)
    return {"zero": 0, "negative": -1, "big": 10**6, "float": float(v), "bool": True, "nan": math.nan}.get(how, v)


def corrupt(pdir: Path, c: tuple) -> None:
    kind = c[0]
    meta_path = pdir / "meta.json"
    if kind in ("delete", "truncate", "flip", "append"):
        path = pdir / c[1]
        if not path.is_file():
            return
        blob = bytearray(path.read_bytes())
        if kind == "delete":
            path.unlink()
        elif kind == "truncate":
            path.write_bytes(bytes(blob[: c[2][0] % max(1, len(blob))]))
        elif kind == "flip" and blob:
            for i in c[2]:
                blob[i % len(blob)] ^= 1 << (i % 8)
            path.write_bytes(bytes(blob))
        else:
            path.write_bytes(bytes(blob) + bytes(b % 256 for b in c[2]))
        return
    if kind == "meta_is_dir":
        if meta_path.is_file():
            meta_path.unlink()
        meta_path.mkdir(exist_ok=True)
        return
    if kind == "dir_is_file":
        shutil.rmtree(pdir)
        pdir.write_text("not a directory\n")
        return
    if kind == "extra_file":
        (pdir / "part_7.pt").write_bytes(b"junk")
        return
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError):
        return
    if not isinstance(meta, dict):
        return
    if kind == "edit_meta":
        meta[c[1]] = c[2]
    elif kind == "drop_meta_key":
        meta.pop(c[1], None)
    elif kind == "edit_report":
        if isinstance(meta.get("report"), dict):
            meta["report"][c[1]] = c[2]
    elif kind == "meta_not_dict":
        meta = c[1]
    elif kind == "forge_part":
        part = pdir / "part_0.pt"
        files = meta.get("files")
        if not part.is_file() or not isinstance(files, dict):
            return
        try:
            payload = torch.load(part, weights_only=True)
        except Exception:  # already corrupted by an earlier step
            return
        if not isinstance(payload, dict) or c[1] not in payload:
            return
        if c[2] == "drop":
            payload.pop(c[1], None)
        else:
            try:
                payload[c[1]] = forge_value(payload[c[1]], c[2])
            except (TypeError, ValueError, RuntimeError):  # e.g. float(None) after an earlier forge
                return
        torch.save(payload, part)
        files["part_0.pt"] = hashlib.sha256(part.read_bytes()).hexdigest()
    meta_path.write_text(json.dumps(meta))


@dataclass(frozen=True)
class PartitionFixture:
    graph: Path
    one: Path
    """A valid 1-part directory of ``graph``."""
    two: Path
    """A valid 2-part directory of ``graph``."""


@pytest.fixture(scope="module")
def partition_fixture(tmp_path_factory: pytest.TempPathFactory) -> PartitionFixture:
    root = tmp_path_factory.mktemp("parts")
    graph = root / "g.pt"
    torch.save(build_graph(GraphSpec(n=30, f=3, c=3, e=70, seed=1)), graph)
    dirs = []
    for p in (1, 2):
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["partition", "--dataset", str(graph), "--parts", str(p), "--out", str(root / f"p{p}")]) == 0
        dirs.append(root / f"p{p}")
    return PartitionFixture(graph, *dirs)


def prop_partition_dir(h: Harness, fx: PartitionFixture, cs: list[tuple]) -> None:
    with h.workspace() as ws:
        pdir = ws / "in" / "parts"
        shutil.copytree(fx.one, pdir)
        for c in cs:
            if pdir.is_dir():
                corrupt(pdir, c)
        h.train(ws, "--dataset", str(fx.graph), "--parts", "1", "--partition-dir", str(pdir))


# --------------------------------------------------------------------------- gossip topologies

TOPO_SUFFIXES = (".txt", ".edgelist", "", ".graphml", ".gml", ".csv")
NODE_IDS = st.one_of(st.integers(-1, 3), st.integers(0, 1), st.sampled_from(["a", "1.5", "0x1", "", " 0"]))


@dataclass(frozen=True)
class TopoCase:
    suffix: str
    nodes: tuple
    edges: tuple
    junk: str | bytes | None
    method: str | None


@st.composite
def topo_cases(draw: Callable) -> TopoCase:
    suffix = draw(st.sampled_from(TOPO_SUFFIXES))
    if draw(st.booleans()):  # one rank: a file naming node 0 alone is valid
        nodes = (0,)
        edges = draw(st.sampled_from([((0, 0),), ((0, 0),), (), ((0, 0), (0, 0))]))
    else:
        nodes = tuple(draw(st.lists(NODE_IDS, max_size=3)))
        edges = tuple(draw(st.lists(st.tuples(NODE_IDS, NODE_IDS), max_size=3)))
    junk = None
    if draw(st.integers(0, 4)) == 0:
        junk = draw(st.one_of(st.text(max_size=30), st.binary(max_size=30),
                              st.sampled_from(["0 0 {'weight': 1}", "0 0 {bad", "0", "graph [", "<graphml>",
                                               "0 0\n0 x\n"])))
    method = draw(st.none() | st.sampled_from(["dpsgd", "dpsgd-atc", "pushsum", "tracking", "tracking-atc"]))
    return TopoCase(suffix=suffix, nodes=nodes, edges=edges, junk=junk, method=method)


def _q(v: Any) -> str:
    return str(v) if isinstance(v, int) else json.dumps(v)


def topology_text(case: TopoCase) -> str | bytes:
    if case.junk is not None:
        return case.junk
    if case.suffix == ".graphml":
        body = "".join(f'<node id="{v}"/>' for v in case.nodes)
        body += "".join(f'<edge source="{u}" target="{v}"/>' for u, v in case.edges)
        return ('<?xml version="1.0" encoding="UTF-8"?><graphml xmlns="http://graphml.graphdrawing.org/xmlns">'
                f'<graph edgedefault="undirected">{body}</graph></graphml>')
    if case.suffix in (".gml", ".csv"):
        body = "".join(f"  node [ id {_q(v)} label \"n{i}\" ]\n" for i, v in enumerate(case.nodes))
        body += "".join(f"  edge [ source {_q(u)} target {_q(v)} ]\n" for u, v in case.edges)
        return f"graph [\n{body}]\n"
    return "".join(f"{u} {v}\n" for u, v in case.edges)


def prop_topology(h: Harness, graph: Path, case: TopoCase) -> None:
    with h.workspace() as ws:
        path = ws / "in" / f"topo{case.suffix}"
        text = topology_text(case)
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        args = ["--dataset", str(graph), "--parts", "1", "--gossip", str(path)]
        if case.method:
            args += ["--gossip-method", case.method]
        h.train(ws, *args)


# --------------------------------------------------------------------------- tests

@pytest.fixture
def harness(capfd: pytest.CaptureFixture, tmp_path: Path) -> Harness:
    return Harness(capfd, tmp_path)


@pytest.fixture(scope="module")
def tiny_graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("graph") / "g.pt"
    torch.save(build_graph(GraphSpec(n=24, f=3, c=3, e=60, seed=7)), path)
    return path


PROPERTIES: dict[str, tuple[st.SearchStrategy, Callable[[Harness, Path, PartitionFixture, Any], None]]] = {
    "graph_file": (graph_cases(), lambda h, g, fx, c: prop_graph_file(h, c)),
    "masks_labels": (label_cases(), lambda h, g, fx, c: prop_masks_labels(h, c)),
    "config": (config_cases(), lambda h, g, fx, c: prop_config(h, g, c)),
    "partition_dir": (st.lists(corruptions(), min_size=1, max_size=3),
                      lambda h, g, fx, c: prop_partition_dir(h, fx, c)),
    "topology": (topo_cases(), lambda h, g, fx, c: prop_topology(h, g, c)),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(PROPERTIES))
@CI
@given(data=st.data())
def test_fuzz(name: str, data: st.DataObject, harness: Harness, tiny_graph: Path,
              partition_fixture: PartitionFixture) -> None:
    strategy, body = PROPERTIES[name]
    body(harness, tiny_graph, partition_fixture, data.draw(strategy, label=name))


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("name", sorted(PROPERTIES))
@LONG
@given(data=st.data())
def test_fuzz_long(name: str, data: st.DataObject, harness: Harness, tiny_graph: Path,
                   partition_fixture: PartitionFixture) -> None:
    """The same properties with the ``long`` profile (pytest -m slow tests/test_fuzz.py)."""
    strategy, body = PROPERTIES[name]
    body(harness, tiny_graph, partition_fixture, data.draw(strategy, label=name))


# Explicit examples: the bugs fuzzing found (kept as regressions, each a traceback or a
# wrong outcome before its fix) and the few cases that need two ranks.

def _spec(n: int = 6, **kw: Any) -> GraphSpec:
    return GraphSpec(n=n, f=2, c=2, e=8, seed=0, **kw)


REGRESSIONS: list[tuple[str, Any]] = [
    # A non-UTF-8 config, arrays nested 5000 deep, a 5000-digit integer: tomllib raised
    # UnicodeDecodeError / RecursionError / ValueError, not TOMLDecodeError.
    ("config", ConfigCase(tree={}, unknown=(), edit=("bom", 0, ""))),
    ("config", ConfigCase(tree={}, unknown=(), edit=("deep", 4800, ""))),
    ("config", ConfigCase(tree={}, unknown=(), edit=("replace", 0, "a = " + "9" * 5000))),
    # NaN passed positive() (nan < 0 is False) and reached torch's optimiser; inf and 1e300
    # overflowed float32 inside the rank (run directory left behind).
    ("config", ConfigCase(tree={"train": {"lr": math.nan}}, unknown=(), edit=None)),
    ("config", ConfigCase(tree={"train": {"weight_decay": math.nan}}, unknown=(), edit=None)),
    ("config", ConfigCase(tree={"train": {"lr": math.inf}}, unknown=(), edit=None)),
    ("config", ConfigCase(tree={"train": {"lr": 1e300}}, unknown=(), edit=None)),
    ("config", ConfigCase(tree={"runtime": {"timeout_s": math.inf}}, unknown=(), edit=None)),
    # Integers beyond 64 bits: float() overflow, torch.manual_seed overflow, int64 compares.
    ("config", ConfigCase(tree={"train": {"lr": 10**400}}, unknown=(), edit=None)),
    ("config", ConfigCase(tree={"train": {"seed": 10**30}}, unknown=(), edit=None)),
    ("config", ConfigCase(tree={"train": {"seed": I64[1]}, "comm": {"halo": {"bits": 8}}}, unknown=(), edit=None)),
    ("config", ConfigCase(tree={"data": {"max_classes": 10**30}}, unknown=(), edit=None)),
    ("config", ConfigCase(tree={"partition": {"seed": 2**64}}, unknown=(), edit=None)),
    # An absurd label in a graph without masks: the split's bincount asked for terabytes.
    ("masks_labels", LabelCase(spec=_spec(), y_edits=((1, 2**40),), mask_edits=(), mask_forms=(), lengths=(),
                               dropped=MASKS, num_classes=None, max_classes=None, allow_overlap=None, ratios=None)),
    # A sparse x with an index outside its size: to_dense() wrote out of bounds (a later
    # segfault); now torch.load checks sparse invariants.
    ("graph_file", GraphCase(spec=_spec(27), mutations=(("dtype", ("x", "bfloat16")),
                                                        ("int_value", ("edge_index", 72, "big")), ("sparse_x", ())),
                             raw="flipped", raw_arg=[13044, 5911])),
    # A corrupt zip whose error (UnicodeDecodeError) cannot be rebuilt from a message string.
    ("graph_file", GraphCase(spec=_spec(18), mutations=(("drop", ("edge_index",)),), raw="flipped", raw_arg=[7371])),
    # meta.json with invalid UTF-8; a report whose per-rank lists are not lists of ints.
    ("partition_dir", [("flip", "meta.json", [5, 6, 7])]),
    ("partition_dir", [("edit_report", "nodes", None)]),
    ("partition_dir", [("edit_report", "halo_in", "ab")]),
    # Part files re-saved with a matching sha256 but bad contents reached the trainer.
    ("partition_dir", [("forge_part", "y", "float")]),
    ("partition_dir", [("forge_part", "y", "negative")]),
    ("partition_dir", [("forge_part", "x", "nan")]),
    # GML node ids of mixed types: sorted() raised TypeError.
    ("topology", TopoCase(suffix=".gml", nodes=(0, "a"), edges=(), junk=None, method=None)),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name, case", REGRESSIONS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(REGRESSIONS)])
def test_fuzz_regressions(name: str, case: Any, harness: Harness, tiny_graph: Path,
                          partition_fixture: PartitionFixture) -> None:
    PROPERTIES[name][1](harness, tiny_graph, partition_fixture, case)


@pytest.mark.timeout(120)
def test_corrupt_two_part_dir_is_refused_before_ranks_start(harness: Harness,
                                                           partition_fixture: PartitionFixture) -> None:
    """Every rank's file is checked by the launcher: a corrupt part_1.pt or meta.json of a
    2-part directory is one line, before any rank is spawned (so this is quick)."""
    for c in [("flip", "part_1.pt", [100]), ("truncate", "meta.json", [10]),
              ("edit_report", "halo_in", "x"), ("forge_part", "x", "nan")]:
        with harness.workspace() as ws:
            pdir = ws / "in" / "parts"
            shutil.copytree(partition_fixture.two, pdir)
            corrupt(pdir, c)
            rc, _ = harness.train(ws, "--dataset", str(partition_fixture.graph), "--parts", "2",
                                  "--partition-dir", str(pdir))
            assert rc == 2, c


@pytest.mark.timeout(120)
def test_gossip_files_with_two_ranks(harness: Harness, tiny_graph: Path) -> None:
    """A valid two-rank topology file trains; a disconnected one, only read inside the
    ranks, is still one line with exit 2 and no run directory (two spawns, ~10 s)."""
    with harness.workspace() as ws:
        (ws / "in" / "ok.txt").write_text("0 1\n")
        rc, _ = harness.train(ws, "--dataset", str(tiny_graph), "--parts", "2", "--gossip", str(ws / "in" / "ok.txt"))
        assert rc == 0
    with harness.workspace() as ws:
        (ws / "in" / "split.gml").write_text("graph [\n node [ id 0 ]\n node [ id 1 ]\n]\n")
        rc, err = harness.train(ws, "--dataset", str(tiny_graph), "--parts", "2",
                                "--gossip", str(ws / "in" / "split.gml"))
        assert rc == 2 and "not connected" in err
