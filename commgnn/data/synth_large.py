"""Big synthetic graphs written to a graph folder chunk by chunk, never held in memory.

Model (a Chung-Lu graph with nested communities; written by hand, as no maintained
library generates such graphs out of core):

* **Expected degrees** ``w``: i.i.d. Pareto draws ``(1 - u)^(-1 / (exponent - 1))``,
  scaled to sum E and clipped at ``min(sqrt(E), N / 10)`` (the Chung-Lu condition
  ``max w^2 <= sum w`` that keeps hub pairs from repeating edges), rescaled and clipped
  again until stable. Degrees are heavy-tailed: ``P(w > x) ~ x^(1 - exponent)``.
* **Communities** of ``community_size * U(0.5, 1.5)`` nodes (at least 2) and **groups** of
  ``communities_per_group`` consecutive communities. Nodes live at *positions* 0..N-1,
  communities and groups being runs of positions; node ids are a random permutation of
  the positions, so no community is a contiguous id range.
* Every node splits ``w`` into three kinds of stubs: ``(1 - mixing) w`` in its community,
  capped at ``min(sqrt(V_c) / 2, (s_c - 1) / 2)`` for a community of ``s_c`` nodes and
  volume ``V_c``; the excess in its group, capped at ``(s_g - 1) / 8`` for a group of
  ``s_g`` nodes; the rest (``mixing w`` plus what the caps left) anywhere. The caps keep
  a hub from meeting the same node twice inside a small community or group.
* **Edges**: each of the E/2 undirected edge slots takes a kind with probability equal to
  that kind's share of the total weight (a multinomial per block) and draws its source
  with probability proportional to that kind's weights. An anywhere-edge draws its target
  the same way (Chung-Lu); a community- or group-edge draws it uniformly inside the
  source's community or group (uniform, not proportional to the weights, as that halves
  the repeated pairs of a dense community). Node i's expected degree is thus
  ``(w_c,i + mean_c) / 2 + (w_g,i + mean_g) / 2 + w_any,i`` (``w_k`` its stubs of kind k,
  ``mean`` their average over its community or group): heavy-tailed as ``w`` is. The
  share of edges of each kind is recorded as ``stats`` in meta.json.
* A target equal to its source is redrawn once from the anywhere-kind, then moved to the
  next position if still equal: there are **no self loops**. **Multi-edges are kept**:
  the caps make them rare (a few percent of the undirected edges at the defaults, bounded
  by the tests on a small instance), and removing them exactly would need the whole edge
  list at once.
* **Labels**: each community gets a class (balanced over communities); a node takes its
  community's class, or with probability ``label_noise`` a uniform class.
* **Features**: ``centroid[y] + feature_noise * z``, centroid coordinates ``~ N(0, 1/F)``,
  ``z`` a discretised standard normal (65536 quantiles), stored as ``x_dtype``.
* **Splits**: disjoint uniform random train/valid/test id sets of
  ``round(fraction * N)`` nodes each, ascending.

Layout: column ``j < E/2`` of ``edge_index`` is undirected edge j as (source, target) and
column ``j + E/2`` is its reverse, so the folder is symmetric with ``directed = false``.

Memory: per-node arrays of at most about 40 bytes per node (three float64 cumulative
weights, the int32 position-to-id map, int16 labels; float32 weights while setting up)
plus O(chunk) per edge or feature block; nothing of size E. The output arrays are memory
maps, so the written pages also count in the resident set until the kernel writes them
back (file-backed and reclaimable).

Determinism: every block draws from its own ``SeedSequence(seed, spawn_key)`` child, so
the bytes written depend on the config only (``chunk`` included), not on timing.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Callable

import numpy as np
from scipy.special import ndtri

from commgnn.data.config import BigSynthConfig
from commgnn.data.ondisk import GraphFolderWriter

NAME = "synth-large"
"""The ``name`` written to meta.json."""

_NODES, _EDGES, _FEATURES = 0, 1, 2  # seed streams: per-node setup, edge blocks, feature blocks
_FINE = 1024  # bucket of the two-level search (a power of 2)
_TWO_LEVEL = 1 << 23  # above this many nodes, np.searchsorted's cache misses make it slower


def _rng(seed: int, *key: int) -> np.random.Generator:
    """An independent generator per (stream, block): blocks do not share state."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=key)))


@dataclasses.dataclass
class _Kind:
    """One kind of edge: cumulative source weights over positions and the segments
    (communities, groups or the whole graph) inside which a target is drawn."""

    cum: np.ndarray
    """``[N]`` float64 inclusive cumulative weights."""
    bounds: np.ndarray
    """``[S + 1]`` int64 first position of each segment, then N; ``[0, N]`` for the
    anywhere-kind, whose targets follow the weights (Chung-Lu) instead of being uniform."""

    anywhere: bool
    """True for the anywhere-kind."""
    coarse: np.ndarray | None = None
    """Every ``_FINE``-th entry of ``cum`` (the last of each bucket), for :func:`_search`
    on large graphs; None where ``np.searchsorted`` is faster."""

    @property
    def total(self) -> float:
        return float(self.cum[-1])


def _kind(w: np.ndarray, starts: np.ndarray | None) -> _Kind:
    """The kind of weights ``w`` with segments starting at ``starts`` (None: anywhere)."""
    bounds = np.array([0, len(w)]) if starts is None else np.append(starts, len(w))
    cum = np.cumsum(w, dtype=np.float64)
    coarse = cum[_FINE - 1::_FINE].copy() if len(w) > _TWO_LEVEL else None
    return _Kind(cum=cum, bounds=bounds.astype(np.int64), anywhere=starts is None, coarse=coarse)


def _degrees(cfg: BigSynthConfig, rng: np.random.Generator) -> np.ndarray:
    """``[N]`` float32 expected degrees (power law, clipped; see the module docstring)."""
    n, e = cfg.nodes, float(cfg.edges)
    w = rng.random(n, dtype=np.float32)
    np.subtract(np.float32(1), w, out=w)  # (0, 1]: no division by zero below
    np.power(w, np.float32(-1.0 / (cfg.degree_exponent - 1.0)), out=w)
    cap = np.float32(max(min(math.sqrt(e), n / 10.0), e / n))
    for _ in range(8):  # clipping lowers the sum: rescale and clip until stable
        w *= np.float32(e / float(w.sum(dtype=np.float64)))
        np.minimum(w, cap, out=w)
    return w


def _segments(sizes_mean: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """Start positions of consecutive runs of ``sizes_mean * U(0.5, 1.5)`` (>= 2) positions
    covering 0..n-1; a last run shorter than 2 joins the previous one."""
    if sizes_mean >= n:
        return np.zeros(1, dtype=np.int64)
    k = 2 * (n // sizes_mean) + 2  # sizes are >= sizes_mean / 2, so k runs cover n
    sizes = np.maximum(2, np.rint(sizes_mean * (0.5 + rng.random(k)))).astype(np.int64)
    starts = np.concatenate(([0], np.cumsum(sizes)))
    starts = starts[starts < n]
    if n - starts[-1] < 2 and len(starts) > 1:
        starts = starts[:-1]
    return starts


def _capped(w: np.ndarray, starts: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """``min(w, cap[segment])`` per position (float32)."""
    sizes = np.diff(np.append(starts, len(w)))
    return np.minimum(w, np.repeat(cap.astype(np.float32), sizes))


def _normal_table() -> np.ndarray:
    """The 65536 quantiles ``Phi^-1((i + 0.5) / 65536)`` of N(0, 1) as float32: drawing
    uniform 16-bit indices into it gives a discretised standard normal (std 0.99999, tails
    cut at 4.32) about six times faster than numpy's float32 ziggurat, which would
    dominate the time spent on features."""
    return ndtri((np.arange(1 << 16) + 0.5) / (1 << 16)).astype(np.float32)


def _sorted_uniform(rng: np.random.Generator, k: int, scale: float) -> np.ndarray:
    """``k`` sorted uniforms in [0, scale) without a sort (normalised exponential spacings):
    searchsorted is ~10x faster on sorted keys."""
    c = np.cumsum(rng.standard_exponential(k + 1))
    return c[:-1] * (scale / c[-1])


def _search(kind: _Kind, keys: np.ndarray) -> np.ndarray:
    """The position p with ``cum[p-1] <= key < cum[p]`` for each key (zero-weight positions
    are never hit). On large graphs a two-level search: ``np.searchsorted`` on the cached
    coarse array, then a branchless binary search inside the bucket of ``_FINE`` positions
    (written by hand: numpy has no batched search on per-key ranges). It is 2-3x faster
    than one ``np.searchsorted`` over a cumulative array that does not fit the caches."""
    cum, n = kind.cum, len(kind.cum)
    if kind.coarse is None:
        p = np.searchsorted(cum, keys, side="right")
    else:
        p = np.searchsorted(kind.coarse, keys, side="right").astype(np.int64) * _FINE
        step = _FINE // 2
        while step:  # p += step while cum[p + step - 1] <= key: counts the bucket's cum <= key
            mid = np.minimum(p + (step - 1), n - 1)
            p += (cum[mid] <= keys) * step
            step //= 2
    np.minimum(p, n - 1, out=p)
    return p


def _draw(kind: _Kind, k: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``k`` (source, target) position pairs of one kind, sources ascending: the source
    proportional to the kind's weights; the target proportional to them too when the kind
    spans the whole graph, else uniform inside the source's segment."""
    src = _search(kind, _sorted_uniform(rng, k, kind.total))
    if kind.anywhere:  # one segment: targets independent of sources, shuffle them
        return src, _search(kind, _sorted_uniform(rng, k, kind.total))[rng.permutation(k)]
    seg = np.searchsorted(kind.bounds, src, side="right") - 1
    lo, hi = kind.bounds[seg], kind.bounds[seg + 1]
    tgt = lo + (rng.random(k) * (hi - lo)).astype(np.int64)
    np.minimum(tgt, hi - 1, out=tgt)  # float rounding of u * size up to size
    return src, tgt


def _edge_block(kinds: list[_Kind], shares: np.ndarray, glob: _Kind, m: int,
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``m`` undirected edges as (source, target) positions, no self loops."""
    counts = rng.multinomial(m, shares)
    parts = [_draw(kd, int(c), rng) for kd, c in zip(kinds, counts) if c > 0]
    src = np.concatenate([p[0] for p in parts])
    tgt = np.concatenate([p[1] for p in parts])
    loop = np.flatnonzero(src == tgt)
    if loop.size:
        tgt[loop] = _search(glob, rng.random(loop.size) * glob.total)
        still = loop[src[loop] == tgt[loop]]
        tgt[still] = (tgt[still] + 1) % len(glob.cum)
    return src, tgt


def generate_graph_folder(cfg: BigSynthConfig, out: str | Path, *,
                          progress: Callable[[str], None] | None = None) -> Path:
    """Write the graph ``cfg`` describes as a graph folder at ``out`` (see the module
    docstring for the model) and return its path.

    Written through :class:`~commgnn.data.ondisk.GraphFolderWriter`: nothing appears at
    ``out`` until the folder is complete; an existing graph folder there is replaced.
    ``edge_index`` is int32 where ids fit, ``y`` int16, ``x`` ``cfg.x_dtype``; meta.json has
    ``directed = false``, ``name``, the generator's parameters and ``stats`` (communities,
    groups, the expected share of each edge kind). Peak memory: about 40 bytes per node
    plus O(``cfg.chunk``), never O(E). ``progress`` receives one line per stage and about
    every tenth of the edge and feature blocks."""
    say = progress or (lambda _msg: None)
    n, m, f, c = cfg.nodes, cfg.edges // 2, cfg.features, cfg.classes
    rng = _rng(cfg.seed, _NODES)

    # --- per-node setup, in position order
    w = _degrees(cfg, rng)
    comm = _segments(cfg.community_size, n, rng)
    group = comm[:: cfg.communities_per_group].copy()
    max_weight = float(w.max())
    sizes = np.diff(np.append(comm, n))
    # one kind at a time, in place where possible: at most ~5 float32 per-node arrays
    # and the float64 cumulative sums live at once
    w_in = w * np.float32(1.0 - cfg.mixing)
    vol = np.add.reduceat(w_in, comm, dtype=np.float64)
    w_c = _capped(w_in, comm, np.minimum(0.5 * np.sqrt(vol), (sizes - 1) / 2.0))
    kinds = [_kind(w_c, comm)]
    totals = [float(w_c.sum(dtype=np.float64))]
    excess = np.subtract(w_in, w_c, out=w_in)
    del w_c, w_in
    w_g = _capped(excess, group, (np.diff(np.append(group, n)) - 1) / 8.0)
    kinds.append(_kind(w_g, group))
    totals.append(float(w_g.sum(dtype=np.float64)))
    excess -= w_g
    del w_g
    w_any = np.multiply(w, np.float32(cfg.mixing), out=w)  # mixing * w plus what the caps left
    w_any += excess
    del excess, w
    np.maximum(w_any, 0, out=w_any)  # float32 rounding
    kinds.append(_kind(w_any, None))
    totals.append(float(w_any.sum(dtype=np.float64)))
    del w_any
    shares = np.array(totals) / sum(totals)
    glob = kinds[2] if totals[2] > 0 else _kind(np.ones(n, dtype=np.float32), None)
    id_dtype = np.int32 if n <= np.iinfo(np.int32).max else np.int64
    ids = np.arange(n, dtype=id_dtype)
    rng.shuffle(ids)  # ids[position] = node id
    comm_class = (rng.permutation(len(comm)) % c).astype(np.int16)
    y_pos = np.repeat(comm_class, sizes)
    noisy = np.flatnonzero(rng.random(n, dtype=np.float32) < cfg.label_noise)
    y_pos[noisy] = rng.integers(0, c, size=noisy.size, dtype=np.int16)
    del noisy
    y = np.empty(n, dtype=np.int16)
    y[ids] = y_pos
    del y_pos
    say(f"setup: {n:,} nodes in {len(comm):,} communities and {len(group):,} groups; "
        f"edge shares community {shares[0]:.3f}, group {shares[1]:.3f}, anywhere {shares[2]:.3f}")

    stats: dict[str, Any] = {
        "communities": int(len(comm)), "groups": int(len(group)),
        "community_share": float(shares[0]), "group_share": float(shares[1]),
        "global_share": float(shares[2]), "max_weight": max_weight,
    }
    params = dataclasses.asdict(cfg)
    writer = GraphFolderWriter(out, num_nodes=n, num_edges=cfg.edges, num_features=f, num_classes=c,
                               directed=False, x_dtype=cfg.x_dtype, y_dtype="int16",
                               extra_meta={"name": NAME, "generator": "commgnn.data.synth_large",
                                           "params": params, "stats": stats})
    with writer:
        ei = writer.edge_index
        blocks = -(-m // cfg.chunk)
        for b in range(blocks):
            s, e = b * cfg.chunk, min(m, (b + 1) * cfg.chunk)
            src, tgt = _edge_block(kinds, shares, glob, e - s, _rng(cfg.seed, _EDGES, b))
            u, v = ids[src], ids[tgt]
            ei[0, s:e], ei[1, s:e] = u, v
            ei[0, m + s:m + e], ei[1, m + s:m + e] = v, u
            if (b + 1) % max(1, blocks // 10) == 0 or b + 1 == blocks:
                say(f"edges: {e:,} of {m:,} undirected edges")
        del kinds, glob, ids

        writer.y[:] = y
        centroids = _rng(cfg.seed, _NODES, 1).standard_normal((c, f), dtype=np.float32)
        centroids *= np.float32(1.0 / math.sqrt(f))
        table = _normal_table() * np.float32(cfg.feature_noise)
        rows = max(1, cfg.chunk // f)
        blocks = -(-n // rows)
        for b in range(blocks):
            s, e = b * rows, min(n, (b + 1) * rows)
            pick = _rng(cfg.seed, _FEATURES, b).integers(0, 1 << 16, size=(e - s, f), dtype=np.uint16)
            x = np.take(table, pick)
            x += centroids[y[s:e]]
            writer.x[s:e] = x  # cast to x_dtype on assignment
            if (b + 1) % max(1, blocks // 10) == 0 or b + 1 == blocks:
                say(f"features: {e:,} of {n:,} rows")
        del y

        perm = np.arange(n, dtype=id_dtype)
        _rng(cfg.seed, _NODES, 2).shuffle(perm)
        at = 0
        for name, frac in (("train", cfg.train_fraction), ("valid", cfg.valid_fraction),
                           ("test", cfg.test_fraction)):
            k = min(int(round(frac * n)), n - at)
            writer.set_split(name, np.sort(perm[at:at + k]))
            at += k
        del perm
        path = writer.commit()
    say(f"wrote {path}")
    return path
