"""``commgnn predict RUN_DIR``: a thin shell over :func:`commgnn.api.predict.predict`."""

from __future__ import annotations

from pathlib import Path

import torch


def predict(run_dir: Path, *, out: Path, dataset: str | None = None, data_root: str | None = None,
            parts: int | None = None) -> torch.Tensor:
    """Scores ``[N, C]`` of every node of the run's graph (or ``dataset``), saved to ``out``."""
    from commgnn.api.predict import predict as predict_scores

    return predict_scores(run_dir, dataset, out=out, parts=parts, data_root=data_root)
