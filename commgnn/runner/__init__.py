"""One run of commgnn, below the Python API and the CLI: the resolved configuration
(:mod:`~commgnn.runner.config`), the pre-flight checks (:mod:`~commgnn.runner.preflight`),
the launcher of local or ``torchrun`` ranks and the run directory
(:mod:`~commgnn.runner.launch`), one rank's training (:mod:`~commgnn.runner.rank`) and a
user's own module carried to the ranks (:mod:`~commgnn.runner.own_model`).

It assembles every layer below it (data, partition, comm, models, trainers, metrics,
report); :mod:`commgnn.api`, the planner and the CLI are built on it.
"""
