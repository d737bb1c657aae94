"""Shared pytest fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED_DATASETS = Path(__file__).resolve().parents[2] / "shared" / "datasets"
"""The staged real datasets beside the clone (``<checkout>/../shared/datasets``); may be absent."""

# CodeCarbon's per-rank start-up (~0.7 s of CPU) would add minutes over the suite's runs;
# tests/test_energy.py measures with it on.
os.environ.setdefault("COMMGNN_ENERGY", "0")

DATA_ROOT_ENV = "COMMGNN_DATA_ROOT"
"""Environment variable naming a data root; tried before :data:`SHARED_DATASETS`."""


def dataset_root_candidates(env: dict[str, str] | None = None) -> list[Path]:
    """Where the staged datasets are looked for, in order: ``$COMMGNN_DATA_ROOT`` (if set),
    then the sibling ``shared/datasets``."""
    env = os.environ if env is None else env
    paths = []
    if env.get(DATA_ROOT_ENV, "").strip():
        paths.append(Path(env[DATA_ROOT_ENV]).expanduser())
    paths.append(SHARED_DATASETS)
    return paths


def find_dataset_root(env: dict[str, str] | None = None) -> tuple[Path | None, str]:
    """The first candidate holding a ``README.md``, and a skip reason for when there is none."""
    tried = dataset_root_candidates(env)
    for path in tried:
        if (path / "README.md").is_file():
            return path, ""
    shown = ", ".join(str(p) for p in tried)
    env = os.environ if env is None else env
    unset = "" if env.get(DATA_ROOT_ENV, "").strip() else " (unset)"
    return None, (f"shared datasets not found: tried {shown}; no README.md there. Set "
                  f"{DATA_ROOT_ENV}{unset} to the folder holding the staged datasets "
                  f"(e.g. {DATA_ROOT_ENV}=/path/to/shared/datasets)")


@pytest.fixture
def shared_datasets() -> Path:
    """Path of the staged real datasets ($COMMGNN_DATA_ROOT first, then the sibling
    ``shared/datasets``); skips the test, saying where it looked, where neither has them."""
    root, reason = find_dataset_root()
    if root is None:
        pytest.skip(reason)
    return root


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    """A fresh, empty, writable cache folder (never the user's ~/.cache)."""
    path = tmp_path / "cache"
    path.mkdir()
    return path


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module of tiny graphs: on a busy 2-core machine a second
    thread only contends (federated clients of 100 nodes ran 10x slower with two)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
