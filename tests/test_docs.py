"""The documentation runs as written: every code block a user would paste is executed.

The rule, explicit in each fence's language:

- a ```` ```python ```` block is saved as a script and run with ``python script.py`` in a
  fresh folder, as a user would run it;
- a ```` ```bash ```` block whose first command starts with ``commgnn`` or ``python`` is run
  with ``bash -e`` in that folder; a ``bash`` block that starts with another command (set-up
  such as ``pip install`` or ``mkdocs serve``, ``torchrun`` on several machines) is not run
  and must carry a skip-test marker saying why, so that it counts among the exceptions;
- the blocks of one page run in order in one folder, so a later block may read what an
  earlier one wrote (a run folder);
- illustrative blocks (output samples, TOML) are fenced ``text``, ``toml``, ``console`` or
  ``json``, and are not run;
- a block that cannot run here (a real dataset, root, a GPU) carries the visible marker
  ``<!-- skip-test: why -->`` on the line before its fence; there are few of them.

The README's and the getting-started page's blocks run in CI; the how-to pages' blocks (small
runs, but several per page) and the slower tutorial scripts are marked ``slow``
(``python -m pytest -m slow tests/test_docs.py`` runs them).

Snippet includes (``--8<-- "examples/x.py"``) are the example scripts themselves, which the
tests at the end of this file (and ``tests/test_api.py`` for ``own_model.py``) run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.parts)]
LANGUAGES = {"python", "bash", "text", "toml", "console", "json"}
MAX_SKIPPED = 13  # blocks marked skip-test, all pages together (6 of them set-up): keep the exceptions few
RUN_COMMANDS = ("commgnn", "python")
"""The first commands of a ``bash`` block that the test runs."""
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.M | re.S)
SKIP = re.compile(r"<!--\s*skip-test:\s*(.+?)\s*-->")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    code: str
    skip: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def runnable(self) -> bool:
        if self.skip or "--8<--" in self.code:
            return False
        if self.lang == "python":
            return True
        if self.lang == "bash":
            return self.first_command in RUN_COMMANDS
        return False

    @property
    def first_command(self) -> str:
        """The first word of the block's first line that is not a comment ("" for none)."""
        first = next((ln for ln in self.code.splitlines() if ln.strip() and not ln.lstrip().startswith("#")), "")
        return first.split()[0] if first.strip() else ""


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for m in FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = SKIP.search(before)
        found.append(Block(page, text[: m.start()].count("\n") + 1, m.group(1).strip(), m.group(2),
                           skip.group(1) if skip else None))
    return found


ALL = [b for p in PAGES for b in blocks(p)]
# Pages whose blocks run in CI (the README's and the first steps'); the others start several
# small runs each (15-35 s apiece on 2 shared cores) and run with `pytest -m slow`.
CI_PAGES = {"README.md", "docs/getting-started.md"}
RUN_PAGES = [pytest.param(p, id=str(p.relative_to(ROOT)),
                          marks=() if str(p.relative_to(ROOT)) in CI_PAGES else pytest.mark.slow)
             for p in PAGES if any(b.runnable for b in blocks(p))]


def _env(tmp: Path) -> dict[str, str]:
    """The checkout under test first on the path, for ``python`` and for ``commgnn``."""
    shim = tmp / ".bin"
    shim.mkdir(exist_ok=True)
    cmd = shim / "commgnn"
    cmd.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m commgnn "$@"\n')
    cmd.chmod(0o755)
    py = shim / "python"
    py.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    py.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{shim}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["COMMGNN_ENERGY"] = "0"  # as the rest of the suite: no CodeCarbon tracker
    return env


def run_block(block: Block, cwd: Path, env: dict[str, str], n: int) -> subprocess.CompletedProcess:
    if block.lang == "python":
        script = cwd / f"block{n}.py"
        script.write_text(block.code)
        argv = [sys.executable, script.name]
    else:
        script = cwd / f"block{n}.sh"
        script.write_text(block.code)
        argv = ["bash", "-e", script.name]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=400)


# ----------------------------------------------------------------------------- the rules

def test_every_fence_names_its_language():
    bare = [b.where for b in ALL if b.lang not in LANGUAGES]
    assert not bare, f"code blocks without a known language ({sorted(LANGUAGES)}): {bare}"


def test_skipped_blocks_are_few_and_say_why():
    skipped = [b for b in ALL if b.skip]
    assert all(len(b.skip) > 10 for b in skipped), [b.where for b in skipped]
    assert len(skipped) <= MAX_SKIPPED, "\n".join(f"{b.where}: {b.skip}" for b in skipped)
    # a marker that is not right before a fence would silently skip nothing
    markers = sum(len(SKIP.findall(p.read_text())) for p in PAGES)
    assert markers == len(skipped)


def test_bash_blocks_that_do_not_run_say_why():
    """A ``bash`` block the test would not run (its first command is not commgnn or python)
    carries a skip-test marker: nothing is left out silently, and the cap counts it."""
    silent = [f"{b.where}: {b.first_command}" for b in ALL
              if b.lang == "bash" and not b.skip and "--8<--" not in b.code and b.first_command not in RUN_COMMANDS]
    assert not silent, silent


def test_there_are_blocks_to_run():
    runnable = [b for b in ALL if b.runnable]
    assert len(runnable) >= 4
    assert any(b.page.name == "README.md" and b.lang == "python" for b in runnable)


def test_readme_is_short_and_links_to_the_docs():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    assert "docs/index.md" in text and "mkdocs serve" in text
    # the two set-up commands, exactly (.ci/run runs the second)
    assert "pip install torch==2.13.0 -e . && commgnn train" in text
    assert "pip install torch==2.13.0 -e '.[test]' && python -m pytest -q" in text
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / link).is_file(), f"README links to a missing page: {link}"


def test_snippet_includes_name_files_that_exist():
    for b in ALL:
        for path in re.findall(r'--8<--\s+"([^"]+)"', b.code):
            assert (ROOT / path).is_file(), f"{b.where}: {path}"


def test_reference_generator_lists_every_flag_and_key():
    sys.path.insert(0, str(DOCS / "hooks"))
    try:
        import reference
    finally:
        sys.path.remove(str(DOCS / "hooks"))
    from commgnn.api import option_sets

    cli = reference.cli_markdown()
    for flag in ("--parts", "--resume", "--secure-agg", "--probe-epochs", "--hosts", "--grid", "--checkpoint-every"):
        assert f"`{flag}" in cli, flag
    config = reference.config_markdown()
    sets = option_sets()
    assert set(reference.CONFIG_ROOTS) == set(sets), "a config root without a section on the reference page"
    for name, option_set in sets.items():
        section = config.split(f"## {reference.CONFIG_ROOTS[name][0]}\n", 1)[1].split("\n## ", 1)[0]
        rows = option_set.reference()
        assert rows, name
        for row in rows:  # each key in its root's section, with its flag where it has one
            line = next((ln for ln in section.splitlines() if ln.startswith(f"| `{row['key']}` |")), None)
            assert line is not None, f"{name}: {row['key']}"
            if row["flag"]:
                assert row["flag"].split(" ")[0] in line, f"{name}: {row['key']} without {row['flag']}"
    assert len(sets["run"].reference()) > 100
    assert "`comm.halo.bits`" in config and "`secagg.enabled`" in config and "`dp_epsilon`" in config


# ----------------------------------------------------------------------------- running the pages

@pytest.mark.timeout(900)
@pytest.mark.parametrize("page", RUN_PAGES)
def test_page_code_runs_as_pasted(page: Path, tmp_path: Path):
    env = _env(tmp_path)
    for n, block in enumerate(b for b in blocks(page) if b.runnable):
        res = run_block(block, tmp_path, env, n)
        if res.returncode != 0:  # the README's Python example included: no __main__ guard needed
            out = res.stdout[-3000:] + res.stderr[-3000:]
            pytest.fail(f"{block.where} ({block.lang}) exited {res.returncode}:\n{out}")
    if page.name == "getting-started.md":
        _check_fields_documented(tmp_path / "runs" / "first")


def _check_fields_documented(run: Path) -> None:
    """Every key of a real run's summary.json and metrics.jsonl is on the outputs page."""
    page = (DOCS / "reference" / "outputs.md").read_text()
    summary = json.loads((run / "summary.json").read_text())
    epoch = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    missing = [k for k in [*summary, *epoch] if f"`{k}`" not in page]
    assert not missing, f"docs/reference/outputs.md does not describe: {missing}"


# ----------------------------------------------------------------------------- the tutorial scripts

def _example(name: str, tmp_path: Path) -> str:
    res = subprocess.run([sys.executable, str(ROOT / "examples" / name), str(tmp_path / "work")], cwd=tmp_path,
                         env=_env(tmp_path), capture_output=True, text=True, timeout=500)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return res.stdout


@pytest.mark.slow  # two commgnn processes, about 30 s; CI runs the federated tutorial and the pages
@pytest.mark.timeout(300)
def test_tutorial_large_graph(tmp_path):
    out = _example("large_graph.py", tmp_path)
    acc = float(re.search(r"test accuracy ([0-9.]+)", out).group(1))
    assert acc > 0.3  # 4 classes: above chance
    parts = tmp_path / "work" / "parts"
    assert (parts / "meta.json").is_file() and (parts / "part_0.pt").is_file() and (parts / "part_1.pt").is_file()


@pytest.mark.timeout(300)
def test_tutorial_federated(tmp_path):
    out = _example("federated.py", tmp_path)
    m = re.search(r"test accuracy ([0-9.]+), worst client ([0-9.]+), uplink ([0-9.]+) MB over (\d+) rounds", out)
    assert m, out
    assert float(m.group(1)) > 0.4 and int(m.group(4)) == 10 and float(m.group(3)) > 0


@pytest.mark.slow  # probes, then a run on the emulated cluster (root) or local ranks: about 45 s
@pytest.mark.timeout(600)
def test_tutorial_cluster_and_plan(tmp_path):
    out = _example("cluster_and_plan.py", tmp_path)
    assert "# commgnn plan: '" in out
    assert "planned run: test accuracy" in out
    assert (tmp_path / "work" / "plan.toml").is_file()
