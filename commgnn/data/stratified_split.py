"""Seeded, stratified train/validation/test splits.

Within every class the labelled nodes are put in a random order (seeded), and the first
``round(train_ratio * n_c)`` go to training, the next ``round(val_ratio * n_c)`` to
validation and the rest to test. The default is 60/20/20. Rounding per class keeps each
class's proportions as close as its size allows; a class of one node lands in training.
Nodes with a negative label (unlabelled) are in no mask.
"""

from __future__ import annotations

import torch
from torch import Tensor

from commgnn.errors import DataError


def stratified_split(
    y: Tensor,
    train_ratio: float = 0.6,
    val_ratio: float = 0.2,
    seed: int = 0,
    labelled_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Split the labelled nodes of ``y`` per class into disjoint boolean masks.

    Args:
        y: ``[N]`` integer labels; ``y < 0`` marks an unlabelled node.
        train_ratio: share of each class for training (default 0.6).
        val_ratio: share of each class for validation (default 0.2); test gets the rest.
        seed: seed of the per-class permutations; the same inputs give the same masks.
        labelled_mask: optional ``[N]`` bool; nodes where it is False are left out too.

    Returns:
        ``(train_mask, val_mask, test_mask)``, each ``[N]`` bool, pairwise disjoint.
    """
    if y.dim() != 1 or y.dtype.is_floating_point or y.dtype == torch.bool:
        raise DataError(f"labels must be a 1-D integer tensor, got shape {tuple(y.shape)} "
                        f"and dtype {y.dtype}")
    if not (0 <= train_ratio <= 1 and 0 <= val_ratio <= 1 and train_ratio + val_ratio <= 1):
        raise DataError(f"split ratios must lie in [0, 1] and sum to <= 1, "
                        f"got train {train_ratio} and val {val_ratio}")
    n = y.numel()
    y = y.long()
    labelled = y >= 0
    if labelled_mask is not None:
        if labelled_mask.shape != (n,):
            raise DataError(f"labelled_mask has shape {tuple(labelled_mask.shape)}, "
                            f"expected ({n},)")
        labelled &= labelled_mask.bool()
    train = torch.zeros(n, dtype=torch.bool)
    val = torch.zeros(n, dtype=torch.bool)
    test = torch.zeros(n, dtype=torch.bool)
    nodes = labelled.nonzero().view(-1)
    if nodes.numel() == 0:
        return train, val, test

    gen = torch.Generator().manual_seed(seed)
    # A global random order, then a stable sort by class: within each class the nodes
    # keep the random order, i.e. one seeded permutation per class, fully vectorised.
    nodes = nodes[torch.randperm(nodes.numel(), generator=gen)]
    nodes = nodes[torch.sort(y[nodes], stable=True).indices]
    # Per present class (not bincount over 0..max(y): one absurd label such as 2**40
    # would ask for terabytes): ``cls`` is each node's class index among those present.
    _, cls, counts = torch.unique_consecutive(y[nodes], return_inverse=True, return_counts=True)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(nodes.numel()) - starts[cls]  # position within its class

    # Round half up per class; validation is cut from what training leaves.
    n_train = torch.floor(counts.double() * train_ratio + 0.5).long()
    n_val = torch.floor(counts.double() * val_ratio + 0.5).long()
    n_val = torch.minimum(n_val, counts - n_train)
    cut_train = n_train[cls]
    cut_val = cut_train + n_val[cls]
    train[nodes[rank < cut_train]] = True
    val[nodes[(rank >= cut_train) & (rank < cut_val)]] = True
    test[nodes[rank >= cut_val]] = True
    return train, val, test
