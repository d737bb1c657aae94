"""Deprecated alias (for one release): the bench grid moved to :mod:`commgnn.api.bench`
(``commgnn.bench``). Importing this module warns; it holds the public names only."""

import warnings

from commgnn.api.bench import *  # noqa: F401,F403
from commgnn.api.bench import aggregate, load_grid, pareto_front, read_run, run_grid, slug, traffic_axis  # noqa: F401

warnings.warn("commgnn.cli.bench moved to commgnn.api.bench; this alias goes in the next release",
              DeprecationWarning, stacklevel=2)
