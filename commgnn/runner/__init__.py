"""One run of commgnn, below the Python API and the CLI: the resolved configuration
(:mod:`~commgnn.runner.config`), the pre-flight checks (:mod:`~commgnn.runner.preflight`),
the run folder (:mod:`~commgnn.runner.run_dir`: manifest, status, staging), preparation
(:mod:`~commgnn.runner.prepare`: partitioning, the memory check), launching
(:mod:`~commgnn.runner.launching` picks :mod:`~commgnn.runner.local` ranks or a
:mod:`~commgnn.runner.torchrun` job), one rank's training (:mod:`~commgnn.runner.rank`) and a
user's own model (:mod:`~commgnn.runner.own_model`).

It assembles every layer below it (data, partition, comm, models, trainers, metrics,
report); :mod:`commgnn.api`, the planner and the CLI are built on it.
"""
