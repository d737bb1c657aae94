"""The Python API, the top floor of commgnn: one module per verb.

Every ``commgnn`` command parses its arguments and calls one of these functions; scripts,
notebooks and benchmarks call them directly. Errors raise :mod:`commgnn.errors` types.

``train``/``resume``/``run`` (:mod:`commgnn.api.train`), ``partition_graph``
(:mod:`commgnn.api.partition`; ``commgnn.partition`` is the subpackage of partitioners),
``bench`` (:mod:`commgnn.api.bench`), ``predict`` (:mod:`commgnn.api.predict`),
``federate`` (:mod:`commgnn.api.federate`), ``plan`` (:mod:`commgnn.api.plan`), ``calibrate``
(:mod:`commgnn.api.calibrate`) and ``run_emulated`` (:mod:`commgnn.api.cluster`; the
emulated cluster).
"""

from __future__ import annotations

from typing import Any

from commgnn.api.train import TrainResult, build_model, load_result, resume, run, train
# the verbs named like their modules are bound here, after their modules are imported, so
# that ``commgnn.api.plan`` is the function (a submodule import would otherwise shadow it)
from commgnn.api.bench import bench
from commgnn.api.federate import FederateResult, federate, load_federate_result
from commgnn.api.predict import predict
from commgnn.api.calibrate import calibrate
from commgnn.api.cluster import run_emulated
from commgnn.api.partition import PartitionResult, partition_graph
from commgnn.api.plan import PlanOutcome, plan

__all__ = ["TrainResult", "build_model", "load_result", "resume", "run", "train", "option_sets", "bench",
           "FederateResult", "federate", "load_federate_result", "predict",
           "calibrate", "run_emulated", "PartitionResult", "partition_graph", "PlanOutcome", "plan"]


def option_sets() -> dict[str, Any]:
    """Every config root's options (:class:`commgnn.options.OptionSet`) by name: ``run``
    (``commgnn train``), ``federate``, ``cluster``, ``plan``, ``calibrate`` and ``bench``
    (the grid file). ``option_sets()["run"].reference()`` lists each key with its keyword,
    flag, type, default and docstring: the configuration reference is generated from it."""
    from commgnn.api.bench import GRID_OPTIONS
    from commgnn.api.calibrate import CALIBRATE_OPTIONS
    from commgnn.api.plan import PLAN_OPTIONS
    from commgnn.cluster.config import CLUSTER_OPTIONS
    from commgnn.federated.options import FEDERATE_OPTIONS
    from commgnn.runner.config import RUN_OPTIONS

    return {"run": RUN_OPTIONS, "federate": FEDERATE_OPTIONS, "cluster": CLUSTER_OPTIONS, "plan": PLAN_OPTIONS,
            "calibrate": CALIBRATE_OPTIONS, "bench": GRID_OPTIONS}
