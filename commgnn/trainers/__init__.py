"""Training loops."""

from commgnn.trainers.config import TrainConfig
from commgnn.trainers.fullgraph import EpochResult, FullGraphTrainer, halo_plan, local_graph

__all__ = ["TrainConfig", "EpochResult", "FullGraphTrainer", "halo_plan", "local_graph"]
