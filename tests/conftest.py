"""Shared pytest fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED_DATASETS = Path(__file__).resolve().parents[2] / "shared" / "datasets"
"""The staged real datasets (``<checkout>/../shared/datasets``); may be absent."""


@pytest.fixture
def shared_datasets() -> Path:
    """Path of the staged real datasets; skips the test where they are not available."""
    if not (SHARED_DATASETS / "README.md").is_file():
        pytest.skip(f"shared datasets not found at {SHARED_DATASETS}")
    return SHARED_DATASETS


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    """A fresh, empty, writable cache folder (never the user's ~/.cache)."""
    path = tmp_path / "cache"
    path.mkdir()
    return path
