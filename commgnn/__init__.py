"""commgnn: communication-efficient distributed GNN training on torch.distributed.

Data flows ``data -> partition -> comm -> models -> trainers -> metrics/report -> cli``;
``dist``, ``config``, ``registry`` and ``errors`` are leaves any layer may use.
"""

__version__ = "0.1.0"
