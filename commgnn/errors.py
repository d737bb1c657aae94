"""Error types shared by every layer (a leaf module).

A :class:`UserError` is a problem with what the user asked for (a bad flag, a missing
dataset, a corrupt partition directory). The CLI prints it as one line and exits with
code 2, without a traceback. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input; reported as one line, exit code 2."""


class ConfigError(UserError):
    """A configuration value or key is invalid."""


class DataError(UserError):
    """A dataset is missing, malformed or inconsistent."""


class PartitionError(UserError):
    """A partitioning request or a saved partition directory is invalid."""


class RankFailure(RuntimeError):
    """A peer rank died or a collective timed out; names the rank where known."""


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: handled like Ctrl-C (ranks stopped, run marked interrupted), exit 143."""

    signal_name = "SIGTERM"


class IntegrityError(UserError):
    """A file of a run or checkpoint is missing, truncated, altered, or needs code to load
    (a pickle that is not tensors and plain data); reported as one line naming the file."""


class DamagedRecord(IntegrityError, ValueError):
    """A run's JSON record (``manifest.json``, ``summary.json``, ...) cannot be read, is not
    JSON, or lacks an entry the command needs; one line naming the file. Also a
    :class:`ValueError`, as the ``json.loads`` error it replaces was, for callers that treat
    an unreadable record as absent."""


class Diverged(RankFailure):
    """A training step's loss or a gradient was not finite (``train.on_nonfinite = "stop"``):
    the run stops at that epoch with exit code 1, naming the epoch and the quantity."""
