"""The Python API, the top floor of commgnn: one module per verb.

Every ``commgnn`` command parses its arguments and calls one of these functions; scripts,
notebooks and benchmarks call them directly. Errors raise :mod:`commgnn.errors` types.
"""

from commgnn.api.federate import FederateResult, federate, load_federate_result
from commgnn.api.predict import predict
from commgnn.api.train import TrainResult, build_model, load_result, resume, run, train

__all__ = ["FederateResult", "TrainResult", "build_model", "federate", "load_federate_result", "load_result",
           "predict", "resume", "run", "train"]
