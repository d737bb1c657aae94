"""Loading graphs: the synthetic CSBM, user ``.pt`` files, graph folders (and OGB's raw
folders) and registered real datasets.

Registered datasets (name, PyG class, folder under the data root; names match
case-insensitively, ignoring ``-``, ``_`` and spaces; aliases in brackets):

* Planetoid, public split (Cora 140/500/1000, CiteSeer 120/500/1000):
  ``Cora``, ``CiteSeer`` (folders ``Cora``, ``CiteSeer``)
* Amazon: ``Computers`` [AmazonComputers], ``Photo`` [AmazonPhoto]
* Coauthor: ``CS`` [CoauthorCS], ``Physics`` [CoauthorPhysics]
* CitationFull: ``Cora_ML``, ``CiteSeer_full`` [CitationFull-CiteSeer], ``DBLP``
  (folders ``CitationFull/{cora_ml,citeseer,dblp}``)
* Actor [Film] (folder ``Actor``); WebKB: ``Cornell``, ``Texas``, ``Wisconsin``
* WikipediaNetwork (Geom-GCN preprocessed): ``chameleon``, ``squirrel``
* HeterophilousGraphDataset: ``Minesweeper``, ``Tolokers``
* Airports: ``USA``, ``Brazil``, ``Europe`` [Airports-USA, ...]
* LINKXDataset (facebook100): ``reed98``, ``amherst41``, ``cornell5``, ``johnshopkins55``
* ``EmailEUCore``, ``PolBlogs``; AttributedGraphDataset: ``BlogCatalog``, ``Flickr``

Normalisation of what PyG returns, applied to every dataset:

* split: PyG's own masks are kept (Planetoid's public split). Masks with one column per
  split (``[N, 10]``: Actor, WebKB, chameleon, squirrel, Minesweeper, Tolokers) use
  column 0. Datasets without masks get :func:`stratified_split` with the config's ratios
  and ``split_seed``.
* labels: ``y < 0`` means unlabelled (LINKX facebook100 stores unknown gender as -1);
  such nodes are in no mask. ``num_classes_total`` is ``max(y) + 1``.
* features: EmailEUCore and PolBlogs have none and get one-hot identity features
  (``x = I_N``), the usual featureless baseline. Sparse features (Flickr) are densified.
  Edges are kept as PyG stores them (some datasets are directed), minus self loops.
* EmailEUCore, PolBlogs, BlogCatalog and Flickr read their raw files with pandas.
"""

from __future__ import annotations

import importlib.util
import os
import re
import warnings
import os.path as osp
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch_geometric.datasets as pyg_datasets
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.transforms import NormalizeFeatures
from torch_geometric.utils import remove_self_loops

from commgnn.config import one_line_errors
from commgnn.data.staging import ensure_copy, locked, root_key
from commgnn.data.config import DataConfig
from commgnn.data.ogb_raw import is_ogb_raw_folder, load_ogb_raw
from commgnn.data.ondisk_check import load_graph_folder
from commgnn.data.stratified_split import stratified_split
from commgnn.data.synthetic import make_csbm
from commgnn.data.validate import MASK_NAMES, mask_as_bool, unusual_tensor, validate_graph
from commgnn.errors import ConfigError, DataError
from commgnn.registry import Registry


@dataclass(frozen=True, kw_only=True)
class DatasetSpec:
    """How to find and load one real dataset with PyG."""

    name: str
    """Canonical name, as listed by :func:`dataset_names`."""
    pyg_class: str
    """Class in ``torch_geometric.datasets``."""
    pyg_name: str | None
    """The class's ``name`` argument; None for classes that take only ``root``."""
    source: str
    """The dataset's folder under the data root, e.g. ``WebKB/cornell``."""
    target: str
    """Where that folder goes under the root passed to PyG ('' = the root itself)."""
    raw: str = "raw"
    """Raw-file folder inside ``source``, checked before copying."""
    aliases: tuple[str, ...] = ()
    """Other accepted names."""
    pandas: bool = False
    """PyG reads the raw files with pandas."""
    featureless: bool = False
    """No node features: one-hot identity features are used."""


DATASETS: Registry[DatasetSpec] = Registry("dataset")


def _add(**kw: Any) -> None:
    spec = DatasetSpec(**kw)
    DATASETS.register(spec.name)(spec)


_add(name="Cora", pyg_class="Planetoid", pyg_name="Cora", source="Cora", target="Cora")
_add(name="CiteSeer", pyg_class="Planetoid", pyg_name="CiteSeer", source="CiteSeer",
     target="CiteSeer")
for _name in ("Computers", "Photo"):
    _add(name=_name, pyg_class="Amazon", pyg_name=_name, source=_name, target=_name,
         aliases=(f"Amazon{_name}",))
for _name in ("CS", "Physics"):
    _add(name=_name, pyg_class="Coauthor", pyg_name=_name, source=_name, target=_name,
         aliases=(f"Coauthor{_name}",))
for _name, _pyg, _aliases in (("Cora_ML", "Cora_ML", ()),
                              ("CiteSeer_full", "CiteSeer", ("CitationFull-CiteSeer",)),
                              ("DBLP", "DBLP", ())):
    _add(name=_name, pyg_class="CitationFull", pyg_name=_pyg, aliases=_aliases,
         source=f"CitationFull/{_pyg.lower()}", target=_pyg.lower())
_add(name="Actor", pyg_class="Actor", pyg_name=None, source="Actor", target="",
     aliases=("Film",))
for _name in ("Cornell", "Texas", "Wisconsin"):
    _add(name=_name, pyg_class="WebKB", pyg_name=_name, source=f"WebKB/{_name.lower()}",
         target=_name.lower())
for _name in ("chameleon", "squirrel"):
    _add(name=_name, pyg_class="WikipediaNetwork", pyg_name=_name,
         source=f"WikipediaNetwork/{_name}", target=_name, raw="geom_gcn/raw")
for _name in ("Minesweeper", "Tolokers"):
    _add(name=_name, pyg_class="HeterophilousGraphDataset", pyg_name=_name,
         source=f"HeterophilousGraphDataset/{_name.lower()}", target=_name.lower())
for _name in ("USA", "Brazil", "Europe"):
    _add(name=_name, pyg_class="Airports", pyg_name=_name, source=f"Airports/{_name.lower()}",
         target=_name.lower(), aliases=(f"Airports-{_name}",))
for _name in ("reed98", "amherst41", "cornell5", "johnshopkins55"):
    _add(name=_name, pyg_class="LINKXDataset", pyg_name=_name, source=f"LINKXDataset/{_name}",
         target=_name)
for _name in ("EmailEUCore", "PolBlogs"):
    _add(name=_name, pyg_class=_name, pyg_name=None, source=_name, target="", pandas=True,
         featureless=True)
for _name in ("BlogCatalog", "Flickr"):
    _add(name=_name, pyg_class="AttributedGraphDataset", pyg_name=_name, pandas=True,
         source=f"AttributedGraphDataset/{_name.lower()}", target=_name.lower())


def _norm(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


_LOOKUP: dict[str, str] = {}
for _spec_name in DATASETS:
    _spec = DATASETS.get(_spec_name)
    for _key in (_spec.name, *_spec.aliases):
        assert _norm(_key) not in _LOOKUP, f"dataset name clash: {_key}"
        _LOOKUP[_norm(_key)] = _spec.name


def dataset_names() -> list[str]:
    """Canonical names of the registered real datasets, sorted (``synthetic`` not included)."""
    return DATASETS.names()


@one_line_errors
def resolve_dataset(name: str) -> DatasetSpec:
    """The spec registered under ``name`` or one of its aliases (case-insensitive)."""
    canonical = _LOOKUP.get(_norm(name))
    if canonical is None:
        raise ConfigError(f"unknown dataset '{name}' (choose from: synthetic, "
                          f"{', '.join(dataset_names())}; or give a path to a .pt graph file or a graph folder)")
    return DATASETS.get(canonical)


def default_cache_dir() -> Path:
    """``~/.cache/commgnn``, used when ``data.cache_dir`` is not set."""
    return Path.home() / ".cache" / "commgnn"


@one_line_errors
def load_dataset(cfg: DataConfig, graph: Any = None) -> Data:
    """Load the graph ``cfg.dataset`` names (or the given ``graph``: a PyG ``Data``, a dict
    of tensors, or an ``InMemoryDataset`` whose first graph is used), normalised and validated.

    The result has ``x`` ``[N, F]`` float32, ``edge_index`` ``[2, E]`` int64, ``y``
    ``[N]`` int64 (``-1`` = unlabelled), 1-D bool ``train_mask`` / ``val_mask`` /
    ``test_mask``, and the plain attributes ``num_classes_total``, ``name`` and
    ``graph_notes`` (:func:`~commgnn.data.validate.graph_notes` of the graph as loaded,
    before self loops are removed: ``{"isolated_nodes": int, "self_loops": int}``). Self
    loops are removed (PolBlogs has 3); other edges are kept as stored. The graph must pass
    :func:`validate_graph` with ``cfg.max_classes`` and ``cfg.allow_mask_overlap``.

    * ``"synthetic"``: :func:`make_csbm` of ``cfg.synthetic``, split with the config's
      ratios and ``split_seed``.
    * a path ending in ``.pt``: a user graph (see :func:`load_graph_file`).
    * a folder path (:func:`is_folder_path`): a graph folder or OGB's raw folder, see
      :func:`load_folder`.
    * a registered name: with ``cfg.root``, the dataset's folder under the root is copied
      into ``<cache_dir>/datasets/<root hash>/<name>/`` and loaded from there, never
      downloading; without a root, PyG downloads it into
      ``<cache_dir>/datasets/download/<name>/``.

    Raises:
        ConfigError: unknown dataset name.
        DataError: missing, incomplete or malformed data (one line each).
    """
    if graph is not None:
        data = _given_graph(graph, cfg)
    elif cfg.dataset.strip().lower() == "synthetic":
        data = make_csbm(cfg.synthetic)
        data.train_mask, data.val_mask, data.test_mask = stratified_split(
            data.y, cfg.train_ratio, cfg.val_ratio, cfg.split_seed)
        data.num_classes_total = cfg.synthetic.num_classes
        data.name = "synthetic"
    elif cfg.dataset.endswith(".pt"):
        data = load_graph_file(Path(cfg.dataset).expanduser(), cfg)
    elif is_folder_path(cfg.dataset):
        data = load_folder(Path(cfg.dataset).expanduser(), cfg)
    else:
        data = _load_registered(resolve_dataset(cfg.dataset), cfg)
    notes = validate_graph(data, max_classes=cfg.max_classes,
                           allow_mask_overlap=cfg.allow_mask_overlap)
    data.graph_notes = notes
    # Self loops are dropped: GCN and GAT add exactly one per node themselves (as PyG's
    # layers do), and a loop stored in the data would otherwise count in the degrees.
    data.edge_index, _ = remove_self_loops(data.edge_index)
    if cfg.normalize_features:
        data = NormalizeFeatures()(data)
    return data


def is_folder_path(dataset: str) -> bool:
    """Whether ``data.dataset`` names a folder rather than a registered dataset: any string
    that reads as a path (holds a ``/`` or starts with ``.`` or ``~``; registered names
    never do), existing or not, so that a missing folder is reported as such; or a name
    that is not registered but is a folder holding ``meta.json`` (a graph folder) or
    OGB's raw files. A registered name wins over a folder of that name."""
    if "/" in dataset or os.sep in dataset or dataset.startswith((".", "~")):
        return True
    if _norm(dataset) in _LOOKUP:
        return False
    p = Path(dataset)
    return p.is_dir() and ((p / "meta.json").is_file() or is_ogb_raw_folder(p))


@one_line_errors
def load_folder(path: Path, cfg: DataConfig) -> Data:
    """A graph folder (:func:`~commgnn.data.ondisk.load_graph_folder`, contents checked in
    one streamed pass first) or OGB's raw folder of a node-property dataset
    (:func:`~commgnn.data.ogb_raw.load_ogb_raw`), read into memory. A folder whose three
    splits are all empty gets a stratified split with the config's ratios, as a ``.pt``
    file without masks does. A missing or malformed folder is a one-line
    :class:`DataError` naming the file."""
    if not path.is_dir():
        raise DataError(f"{path}: not a folder (a graph folder holds meta.json and edge_index.npy; "
                        f"OGB's holds raw/ and split/)")
    if not (path / "meta.json").is_file() and is_ogb_raw_folder(path):
        data = load_ogb_raw(path)
    else:
        data = load_graph_folder(path, allow_overlap=cfg.allow_mask_overlap)
    if not any(bool(data[k].any()) for k in MASK_NAMES):
        data.train_mask, data.val_mask, data.test_mask = stratified_split(
            data.y, cfg.train_ratio, cfg.val_ratio, cfg.split_seed)
    return data


GIVEN_GRAPH = "graph given in Python"
"""The dataset name recorded for a graph handed over in Python."""


def _given_graph(graph: Any, cfg: DataConfig) -> Data:
    """A graph handed over in Python (the API's ``commgnn.train(data, ...)``)."""
    num_classes = None
    if hasattr(graph, "num_classes") and hasattr(graph, "__getitem__") and not isinstance(graph, (Data, dict)):
        num_classes = graph.num_classes  # an InMemoryDataset: its first graph, its class count
        graph = graph[0]
    obj = graph.to_dict() if isinstance(graph, Data) else graph
    if isinstance(obj, dict) and num_classes is not None and obj.get("num_classes") is None:
        obj = {**obj, "num_classes": num_classes}
    return graph_from_object(obj, cfg, name=GIVEN_GRAPH, where="the given graph")


@one_line_errors
def load_graph_file(path: Path, cfg: DataConfig) -> Data:
    """Load a user graph saved with ``torch.save``.

    The file holds a dict (or a :class:`~torch_geometric.data.Data`) with ``x`` ``[N, F]``,
    ``edge_index`` ``[2, E]`` and ``y`` ``[N]`` (``-1`` = unlabelled), and optionally all
    three of ``train_mask`` / ``val_mask`` / ``test_mask`` (1-D, or 2-D with column 0
    used; bool, or integers 0/1 which are converted to bool) and an int ``num_classes``.
    Without masks the graph gets a stratified split. Given masks are used as they are: an
    unlabelled node (``y < 0``) in any of them is an error, not silently dropped. Edges are
    used as given. Only tensors and PyG's Data classes are unpickled (``weights_only=True``),
    so a file cannot run code; a file that is not a ``torch.save`` file, or that holds
    something other than a dict or Data, is a one-line :class:`DataError` naming the file.
    """
    if not path.is_file():
        raise DataError(f"graph file not found: {path}")
    from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
    from torch_geometric.data.storage import GlobalStorage

    try:
        # Sparse tensors are checked as they are loaded (indices within the size): torch
        # skips that by default, and to_dense() of a forged one writes out of bounds.
        # torch's own warnings about what a file holds (deprecated storages, ...) are not
        # the user's business: the content is checked below, and refused in one line.
        with torch.serialization.safe_globals([Data, DataEdgeAttr, DataTensorAttr, GlobalStorage]), \
                torch.sparse.check_sparse_tensor_invariants(enable=True), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # corrupt file, foreign pickle, ...: one line for the user
        raise DataError(f"cannot read graph file {path}: {_load_error(path, exc)}") from exc
    return graph_from_object(obj, cfg, name=path.stem, where=f"graph file {path}")


def graph_from_object(obj: Any, cfg: DataConfig, *, name: str, where: str) -> Data:
    """A user graph given as a dict or a PyG :class:`Data` (what a ``.pt`` file holds, see
    :func:`load_graph_file`), normalised; ``where`` names its origin in error messages."""
    if isinstance(obj, Data):
        obj = obj.to_dict()
    if not isinstance(obj, dict):
        raise DataError(f"{where} must hold a dict or a torch_geometric Data with "
                        f"x, edge_index and y; got {type(obj).__name__}")
    for key in ("x", "edge_index", "y"):
        if not isinstance(obj.get(key), Tensor):
            raise DataError(f"{where} has no tensor '{key}' (needs x, edge_index, y)")
    x, edge_index, y = obj["x"], obj["edge_index"], obj["y"]
    if x.is_complex() or not (x.dtype.is_floating_point or x.dtype == torch.bool
                              or x.dtype in (torch.uint8, torch.int8, torch.int16,
                                             torch.int32, torch.int64)):
        raise DataError(f"{where}: x must be numeric, got dtype {x.dtype}")
    if y.dtype.is_floating_point or y.dtype == torch.bool or y.is_complex():
        raise DataError(f"{where}: y must hold integer class labels, got dtype {y.dtype}")
    if (edge_index.dtype.is_floating_point or edge_index.dtype == torch.bool
            or edge_index.is_complex()):
        raise DataError(f"{where}: edge_index must be an integer tensor, "
                        f"got dtype {edge_index.dtype}")
    present = [k for k in MASK_NAMES if obj.get(k) is not None]
    if present and len(present) != len(MASK_NAMES):
        missing = [k for k in MASK_NAMES if k not in present]
        raise DataError(f"{where} has {', '.join(present)} but not "
                        f"{', '.join(missing)}: give all three masks or none")
    for key in present:
        if not isinstance(obj[key], Tensor):
            raise DataError(f"{where}: {key} must be a tensor, got "
                            f"{type(obj[key]).__name__}")
    for key in ("x", "edge_index", "y", *present):
        problem = unusual_tensor(key, obj[key], dense_ok=key == "x")  # sparse features are densified
        if problem:
            raise DataError(f"{where}: {problem}")
    masks = tuple(obj[k] for k in MASK_NAMES) if present else None
    num_classes = obj.get("num_classes")
    data = _normalise(x, edge_index, y, masks, cfg, name=name, drop_unlabelled=False)
    if num_classes is not None:
        try:
            num_classes = int(num_classes)
        except (TypeError, ValueError, RuntimeError):
            raise DataError(f"{where}: num_classes must be an integer, got "
                            f"{num_classes!r:.60}") from None
        if num_classes < data.num_classes_total:
            raise DataError(f"{where}: num_classes = {num_classes} but y has label "
                            f"{data.num_classes_total - 1}")
        data.num_classes_total = num_classes
    return data


def _load_registered(spec: DatasetSpec, cfg: DataConfig) -> Data:
    cache = Path(cfg.cache_dir).expanduser() if cfg.cache_dir else default_cache_dir()
    cache = cache.absolute() / "datasets"
    if cfg.root is None:
        where = "PyG's download"
        pyg_root = cache / "download" / spec.name
        with locked(cache / "download" / f".{spec.name}.lock"):
            dataset = _call_pyg(spec, pyg_root, offline_src=None)
    else:
        root = Path(cfg.root).expanduser().absolute()
        if not root.is_dir():
            raise DataError(f"data root {root} is not a directory (set data.root to the folder "
                            f"holding the datasets, e.g. shared/datasets)")
        src = root / spec.source
        where = str(src)
        if not (src / spec.raw).is_dir():
            raise DataError(f"dataset '{spec.name}' not found under data root {root}: expected "
                            f"{src / spec.raw} (see the data root's README.md for the layout)")
        base = cache / root_key(root)
        with locked(base / f".{spec.name}.lock"):
            pyg_root = ensure_copy(src, base / spec.name, spec.target)
            dataset = _call_pyg(spec, pyg_root, offline_src=src)
    try:
        raw = dataset[0]
    except Exception as exc:
        raise DataError(f"dataset '{spec.name}' from {where} is unreadable: "
                        f"{_one_line(exc)}") from exc
    x = raw.x
    if spec.featureless or x is None:
        x = torch.eye(raw.num_nodes)
    masks = None
    if raw.get("train_mask") is not None:
        masks = (raw.train_mask, raw.val_mask, raw.test_mask)
    return _normalise(x, raw.edge_index, raw.y, masks, cfg, name=spec.name)


def _call_pyg(spec: DatasetSpec, pyg_root: Path, *, offline_src: Path | None) -> Any:
    """Instantiate the PyG dataset; with ``offline_src`` a missing raw file is a DataError."""
    if spec.pandas and importlib.util.find_spec("pandas") is None:
        raise DataError(f"dataset '{spec.name}' needs pandas to read its raw files: "
                        f"pip install pandas")
    cls = getattr(pyg_datasets, spec.pyg_class)
    if offline_src is not None:
        cls = _offline(cls, spec, offline_src)
    args = [str(pyg_root)] + ([spec.pyg_name] if spec.pyg_name else [])
    try:
        return cls(*args)
    except DataError:
        raise
    except Exception as exc:  # any PyG failure (bad raw file, no network, ...) is one line
        raise DataError(f"PyG could not load dataset '{spec.name}' ({spec.pyg_class}) from "
                        f"{offline_src or pyg_root}: {_one_line(exc)}") from exc


def _offline(cls: type, spec: DatasetSpec, src: Path) -> type:
    """``cls`` with ``download`` replaced by an error: a staged copy must never download."""

    def download(self: Any) -> None:
        missing = [osp.basename(p) for p in self.raw_paths if not osp.exists(p)]
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise DataError(f"dataset '{spec.name}' is incomplete: {src / spec.raw} lacks {shown}")

    return type(cls.__name__, (cls,), {"download": download, "__module__": __name__})


def _normalise(x: Tensor, edge_index: Tensor, y: Tensor, masks: tuple[Tensor, ...] | None,
               cfg: DataConfig, *, name: str, drop_unlabelled: bool = True) -> Data:
    """Bring a graph into the documented form (dtypes, 1-D masks, split, class count).

    Given masks become 1-D bool of length N (a wrong length or non-0/1 value is a
    :class:`DataError`); with ``drop_unlabelled`` (registered datasets) unlabelled nodes
    are taken out of them, otherwise (user files) they stay for :func:`validate_graph`
    to refuse.
    """
    if x.layout != torch.strided:
        x = x.to_dense()
    x = x.to(torch.float32)
    y = y.long()
    if y.dim() != 1:
        raise DataError(f"dataset '{name}': y must hold one class per node, got shape "
                        f"{list(y.shape)} (multi-label data is not supported)")
    if masks is None:
        train, val, test = stratified_split(y, cfg.train_ratio, cfg.val_ratio, cfg.split_seed)
    else:
        n = x.size(0) if x.dim() else 0
        train, val, test = (mask_as_bool(key, _column0(m, name, key), n)
                            for key, m in zip(MASK_NAMES, masks))
        if drop_unlabelled and y.numel() == n:
            labelled = y >= 0
            train, val, test = train & labelled, val & labelled, test & labelled
    labelled_y = y[y >= 0]
    return Data(x=x, edge_index=edge_index.long(), y=y, train_mask=train, val_mask=val,
                test_mask=test, num_nodes=x.size(0) if x.dim() else 0,
                num_classes_total=int(labelled_y.max()) + 1 if labelled_y.numel() else 0,
                name=name)


def _column0(mask: Tensor, name: str, key: str) -> Tensor:
    """A 1-D mask; of one column per split (``[N, k]``) the first is used."""
    if mask.dim() == 2:
        mask = mask[:, 0]
    if mask.dim() != 1:
        raise DataError(f"dataset '{name}': {key} must be [N] or [N, k], got shape "
                        f"{list(mask.shape)}")
    return mask


def _load_error(path: Path, exc: BaseException) -> str:
    """Why ``torch.load`` failed on a user graph file, in one short line."""
    try:
        with path.open("rb") as f:
            head = f.read(8)
    except OSError:  # unreadable (permissions, ...): the OS error says it best
        return _one_line(exc)
    if not (head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"):
        # torch.save writes a zip archive (legacy: a pickle starting with 0x80)
        return (f"not a torch file saved with torch.save: {path.name} "
                f"({path.stat().st_size} bytes, starting {head!r}) is neither a zip archive "
                f"nor a pickle")
    text = " ".join(str(exc).split())
    found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
    if found:
        return (f"it holds a {found.group(1)} object; only tensors, numbers, strings, lists, "
                f"dicts and torch_geometric Data are read (weights_only=True)")
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1].strip()
        return f"{_one_line(exc, text)} (save a dict of tensors with torch.save)"
    first = text.split(". ", 1)[0]  # torch's zip errors go on for several sentences
    return (f"{_one_line(exc, first)} (corrupt or truncated? save a dict of tensors with "
            f"torch.save)")


def _one_line(exc: BaseException, message: str | None = None) -> str:
    """``Type: message`` on one line, at most 300 characters of message (``message``
    replaces ``str(exc)``: not every exception type can be rebuilt from a string)."""
    text = " ".join((str(exc) if message is None else message).split()) or "(no message)"
    text = text if len(text) <= 300 else text[:297] + "..."
    return f"{type(exc).__name__}: {text}"
