"""Fuzz cases: user graph files, masks and labels (used by tests/test_fuzz.py)."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import tomli_w
import torch
from hypothesis import strategies as st
from torch import Tensor


from fuzz_harness import Harness

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


