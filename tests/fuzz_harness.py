"""The fuzzing harness: hypothesis profiles, the in-process CLI runner and the outcome check
(split from tests/test_fuzz.py, which holds the module docstring and the tests)."""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import typing
import warnings
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, currently_in_test_context, event, settings
from hypothesis import note as _note

from commgnn.cli.main import main

# --------------------------------------------------------------------------- profiles

_PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink]  # no slow "explain"
_SUPPRESS = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
             HealthCheck.data_too_large, HealthCheck.filter_too_much]
settings.register_profile("ci", max_examples=40, deadline=None, derandomize=True, database=None,
                          print_blob=True, suppress_health_check=_SUPPRESS, phases=_PHASES)
settings.register_profile("long", max_examples=500, deadline=None, derandomize=False, database=None,
                          print_blob=True, suppress_health_check=_SUPPRESS, phases=_PHASES)
CI = settings.get_profile("ci")
LONG = settings.get_profile("long")

# --------------------------------------------------------------------------- harness

SMALL = ("--epochs", "1", "--hidden", "4", "--layers", "1", "--threads", "1")
"""Flags that keep a run tiny; a config case drops the ones its file sets itself."""



def note(text: str) -> None:
    """hypothesis.note inside a hypothesis example; nothing in a plain test."""
    if currently_in_test_context():
        _note(text)


def _event(text: str) -> None:
    if currently_in_test_context():
        event(text)


def _kind(err: str) -> str:
    """The start of an error line, for the outcome statistics (--hypothesis-show-statistics)."""
    words = err.removeprefix("commgnn: error:").split()
    return " ".join(w for w in words[:4] if "/" not in w)


class Harness:
    """Runs ``commgnn train`` in-process in a fresh workspace per example and checks the
    outcome property. A workspace is ``<root>/wsN/`` with ``in/`` (the inputs) and
    ``out/`` (the parent of the run directory ``out/run``, watched for staging leftovers)."""

    def __init__(self, cap: Any, root: Path) -> None:
        self.cap, self.root = cap, root

    @contextlib.contextmanager
    def workspace(self) -> typing.Iterator[Path]:
        ws = Path(tempfile.mkdtemp(prefix="ws", dir=self.root))
        (ws / "in").mkdir()
        (ws / "out").mkdir()
        try:
            yield ws
        finally:
            shutil.rmtree(ws, ignore_errors=True)

    def train(self, ws: Path, *args: str, small: tuple[str, ...] = SMALL) -> tuple[int, str]:
        """Run ``commgnn train ARGS`` (with --quiet, --out and the SMALL flags), check the
        property, return ``(rc, stderr)``."""
        out = ws / "out" / "run"
        argv = ["train", *args, *small, "--quiet", "--out", str(out)]
        note(f"argv: {argv}")
        self.cap.readouterr()
        with warnings.catch_warnings(record=True) as caught:
            # What `python -m commgnn` would print: Python's default filters (deprecations
            # hidden), each warning once. pytest would otherwise swallow them.
            warnings.simplefilter("always")
            for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
                warnings.filterwarnings("ignore", category=category)
            try:
                rc = main(argv)
            except SystemExit as exc:  # argparse's usage errors exit 2 (after one line)
                rc = exc.code
        err = self.cap.readouterr().err
        shown = {warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line) for w in caught}
        err = "".join(sorted(shown)) + err  # printed before the error line
        note(f"rc={rc} stderr={err!r}")
        _event(f"rc={rc} {_kind(err) if rc else ''}")
        check_outcome(rc, err, out)
        return rc, err


def check_outcome(rc: Any, err: str, out: Path) -> None:
    """The property: success with a complete run directory, or exit 2 with one error line
    and nothing left behind, or (a diverged run, stopped) exit 1 with one line and the run
    marked failed."""
    assert "Traceback" not in err, err
    leftovers = sorted(p.name for p in out.parent.iterdir() if p.name != out.name)
    assert not leftovers, f"staging leftovers next to --out: {leftovers}"
    if rc == 0:
        status = json.loads((out / "status.json").read_text())
        assert status["state"] == "complete", status
        assert (out / "summary.json").is_file()
        return
    if rc == 1 and "training diverged at epoch" in err:  # train.on_nonfinite = "stop" (huge values)
        assert len(err.strip().splitlines()) == 1, f"stderr is not one error line: {err!r}"
        assert json.loads((out / "status.json").read_text())["state"] == "failed"
        return
    assert rc == 2, f"exit code {rc!r}, stderr {err!r}"
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("commgnn: error:"), f"stderr is not one error line: {err!r}"
    assert not out.exists(), f"{out} left behind after an error: {sorted(p.name for p in out.iterdir())}"


