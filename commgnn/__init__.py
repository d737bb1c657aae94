"""commgnn: communication-efficient distributed GNN training on torch.distributed.

Data flows ``data -> partition -> comm -> models -> trainers -> metrics/report -> runner ->
planner -> api -> cli``;
``distributed``, ``config``, ``options``, ``integrity``, ``registry`` and ``errors`` are leaves any layer may use.
"""

__version__ = "0.1.0"

_API = {"train": "commgnn.api", "resume": "commgnn.api", "run": "commgnn.api", "load_result": "commgnn.api", "TrainResult": "commgnn.api",
        "federate": "commgnn.api", "FederateResult": "commgnn.api", "FederateConfig": "commgnn.federated.config",
        "partition_graph": "commgnn.api", "PartitionResult": "commgnn.api", "bench": "commgnn.api",
        "plan": "commgnn.api", "calibrate": "commgnn.api", "run_emulated": "commgnn.api",
        "option_sets": "commgnn.api",
        "RunConfig": "commgnn.runner.config", "CommConfig": "commgnn.comm.config",
        "HaloConfig": "commgnn.comm.config", "GradConfig": "commgnn.comm.config",
        "GossipConfig": "commgnn.comm.config", "ModelConfig": "commgnn.models.config",
        "TrainConfig": "commgnn.trainers.config", "DataConfig": "commgnn.data.config",
        "RuntimeConfig": "commgnn.distributed.config", "errors": "commgnn.errors",
        "predict": "commgnn.api"}
__all__ = ["__version__", *_API]


def __getattr__(name: str) -> object:
    """The API, imported on first use (``import commgnn`` stays cheap for the CLI)."""
    import importlib

    if name not in _API:
        raise AttributeError(f"module 'commgnn' has no attribute {name!r}")
    module = importlib.import_module(_API[name])
    return module if name == "errors" else getattr(module, name)


def __dir__() -> list[str]:
    """The module's names and the lazily imported API, so that ``dir(commgnn)`` and a
    notebook's completion list ``train``, ``CommConfig`` and the rest before first use."""
    return sorted(set(globals()) | set(__all__))
