"""MkDocs hook: writes the CLI and configuration reference pages at build time.

A page that holds the line ``<!-- generated: cli -->`` gets the whole command line, read
from the argparse parsers (``commgnn.cli.main.build_parser()``: every sub-command, its
argument groups, each flag with its metavar, choices and the help text ``--help`` prints).
A page that holds ``<!-- generated: config -->`` gets every configuration key, read from
the option sets (``commgnn.api.option_sets()``): one section per config root (run,
federate, cluster, plan, calibrate, the bench grid), grouped by table, each key with its
Python keyword, flag, type, default and the docstring of its field. The flags, the TOML
keys and the keywords are made from the same declaration (``commgnn/options.py``), so
nothing here is copied by hand and the pages cannot drift from the code.
"""

from __future__ import annotations

import argparse
import html
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # build from a checkout without `pip install -e .`
    sys.path.insert(0, str(ROOT))

# option set name -> (heading, where its keys are set); the order of the page
CONFIG_ROOTS: dict[str, tuple[str, str]] = {
    "run": ("`commgnn train`",
            "a TOML file (`commgnn train --config FILE.toml`), the flags of `commgnn train`, or the "
            "keywords of `commgnn.train(...)`"),
    "federate": ("`commgnn federate`",
                 "a TOML file (`commgnn federate --config FILE.toml`), the flags of `commgnn federate`, "
                 "or the keywords of `commgnn.federate(...)`"),
    "cluster": ("`commgnn cluster`",
                "the flags of `commgnn cluster`, or the keywords of `commgnn.run_emulated(job, ...)`"),
    "plan": ("`commgnn plan`",
             "the flags of `commgnn plan`, or the keywords of `commgnn.plan(...)` (the planned run's own "
             "options come from `--config` and the run flags above)"),
    "calibrate": ("`commgnn calibrate`", "the flags of `commgnn calibrate`, or the keywords of `commgnn.calibrate(...)`"),
    "bench": ("`commgnn bench` grid files", "a grid file (`commgnn bench --grid FILE.toml`)"),
}


# --------------------------------------------------------------------------- config keys

def _cell(text: str) -> str:
    text = re.sub(r":(?:func|class|mod|meth|attr|data|obj):(`+)", r"\1", text)  # reST roles -> code
    text = " ".join(text.split())
    out = []
    for part in re.split(r"(`+[^`]*`+)", text):
        if not part.startswith("`"):  # `[data]` would read as a reference link, `|` as a column
            out.append(part.replace("[", "\\[").replace("|", "\\|"))
        elif "|" in part:  # a table cell's code span cannot hold a pipe: write it as HTML
            code = html.escape(part.strip("`").strip()).replace("|", "&#124;")
            out.append(f"<code>{code}</code>")
        else:
            out.append(part)
    return "".join(out)


def option_sets() -> dict[str, Any]:
    """Every config root's :class:`commgnn.options.OptionSet`, by name."""
    from commgnn.api import option_sets as sets

    return sets()


def config_rows(name: str) -> list[dict[str, str]]:
    """The reference rows of option set ``name`` (``key``, ``keyword``, ``flag``, ``type``,
    ``default``, ``help``), as :meth:`OptionSet.reference` gives them."""
    return option_sets()[name].reference()


def _by_table(option_set: Any) -> list[tuple[str, list[dict[str, str]]]]:
    """The set's rows grouped by their table (the key without its last part; "" for the
    root's own keys), tables in the root's declaration order, rows in the set's order."""
    from commgnn.options import tables

    groups: dict[str, list[dict[str, str]]] = {path.rstrip("."): [] for path, _ in tables(option_set.root)}
    for row in option_set.reference():
        groups.setdefault(row["key"].rpartition(".")[0], []).append(row)
    return [(table, rows) for table, rows in groups.items() if rows]


def _code(text: str) -> str:
    return _cell(f"`{text}`") if text else ""


def config_markdown() -> str:
    sets = option_sets()
    out: list[str] = []
    for name, (heading, where) in CONFIG_ROOTS.items():
        if name not in sets:
            continue
        groups = _by_table(sets[name])
        flags = any(r["flag"] for _, rows in groups for r in rows)
        keywords = name != "bench"  # `commgnn.bench(grid)` takes the file, not its keys
        columns = ["key", *(["keyword"] if keywords else []), *(["flag"] if flags else []), "type", "default",
                   "what it is"]
        out += [f"## {heading}", "", f"Set in {where}. Unknown keys and wrong types are errors.", ""]
        for table, members in groups:
            if table:
                out += [f"### `[{table}]`", ""]
            out += ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
            for r in members:
                cells = [f"`{r['key']}`", *([_code(r["keyword"])] if keywords else []),
                         *([_code(r["flag"])] if flags else []), _code(r["type"]), _code(r["default"]),
                         _cell(r["help"])]
                out.append("| " + " | ".join(cells) + " |")
            out.append("")
    return "\n".join(out)


# --------------------------------------------------------------------------- the CLI

def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser, str]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                found.append((name, sub, helps.get(name, "")))
    return found


def _flag_text(action: argparse.Action) -> str:
    names = ", ".join(action.option_strings) or action.metavar or action.dest
    if action.option_strings and action.nargs != 0:
        meta = action.metavar or (("{" + ",".join(map(str, action.choices)) + "}") if action.choices
                                  else action.dest.upper())
        names += f" {meta}"
    return names


def _help_text(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if action.help is None:
        return ""
    try:  # the parser's own formatter: the text (and default) `--help` prints
        return parser._get_formatter()._expand_help(action)
    except (TypeError, ValueError, KeyError):
        return action.help


def cli_markdown() -> str:
    from commgnn.cli.main import build_parser

    top = build_parser()
    out = [f"`{top.prog}`: {top.description or ''}", "", "| command | what it does |", "|---|---|"]
    subs = _subcommands(top)
    out += [f"| [`{top.prog} {n}`](#{top.prog}-{n}) | {_cell(h)} |" for n, _, h in subs]
    out.append("")
    for name, sub, helptext in subs:
        out += [f"## `{top.prog} {name}`", "", _cell(sub.description or helptext), "", "```text",
                sub.format_usage().strip(), "```", ""]
        for group in sub._action_groups:
            actions = [a for a in group._group_actions if a.help != argparse.SUPPRESS
                       and not isinstance(a, argparse._HelpAction)]
            if not actions:
                continue
            out += [f"**{group.title}**", "", "| argument | help |", "|---|---|"]
            out += [f"| {_cell('`' + _flag_text(a) + '`')} | {_cell(_help_text(sub, a))} |" for a in actions]
            out.append("")
    return "\n".join(out)


# --------------------------------------------------------------------------- the hook

MARKERS = {"<!-- generated: cli -->": cli_markdown, "<!-- generated: config -->": config_markdown}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    for marker, make in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown
