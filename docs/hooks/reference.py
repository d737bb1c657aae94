"""MkDocs hook: writes the CLI and configuration reference pages at build time.

A page that holds the line ``<!-- generated: cli -->`` gets the whole command line, read
from the argparse parsers (``commgnn.cli.main.build_parser()``: every sub-command, its
argument groups, each flag with its metavar, choices and the help text ``--help`` prints).
A page that holds ``<!-- generated: config -->`` gets every configuration key, read from
the config dataclasses (key, type, default and the docstring that follows each field).
Nothing here is copied by hand, so the pages cannot drift from the code.

Only public, stable things are read: parser objects and dataclass fields. Field docstrings
are read from the source with :mod:`ast`, the same way ``tests/test_config_docs.py`` checks
that each field has one.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import html
import inspect
import re
import sys
import textwrap
import types
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # build from a checkout without `pip install -e .`
    sys.path.insert(0, str(ROOT))

# (heading, TOML file it lives in, "module:Class" candidates; the first that imports is used)
CONFIG_ROOTS: list[tuple[str, str, list[str]]] = [
    ("`commgnn train`", "`commgnn train --config FILE.toml`, `commgnn.train(...)`",
     ["commgnn.runner.config:RunConfig"]),
    ("`commgnn federate`", "`commgnn federate --config FILE.toml`",
     ["commgnn.federated.config:FederateConfig"]),
    ("`commgnn cluster`", "the flags of `commgnn cluster` (`commgnn.cluster.config.ClusterConfig`)",
     ["commgnn.cluster.config:ClusterConfig"]),
    ("`commgnn bench` grid files", "`commgnn bench --grid FILE.toml`",
     ["commgnn.bench.config:GridFile", "commgnn.api.bench:GridFile", "commgnn.cli.bench:GridFile"]),
]


# --------------------------------------------------------------------------- config keys

def _field_docs(cls: type) -> dict[str, str]:
    """Docstring of each field of ``cls`` (and of its dataclass bases), from the source."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass) or klass is object:
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef))
        for st, nxt in zip(node.body, node.body[1:]):
            if (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                docs[st.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


def _dataclass_in(tp: Any) -> type | None:
    """The config dataclass a field's type names (``X`` or ``X | None``), else None."""
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return tp
    for arg in typing.get_args(tp):
        if dataclasses.is_dataclass(arg) and isinstance(arg, type):
            return arg
    return None


def _type_text(tp: Any) -> str:
    """A field's type as a user reads it: ``int | None``, ``'none' | 'pipeline'``, ``tuple[int, ...]``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_text(a) for a in args)
    if origin is not None:
        inner = ", ".join("..." if a is Ellipsis else _type_text(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    if tp is type(None):
        return "None"
    if dataclasses.is_dataclass(tp):
        return "table"
    return getattr(tp, "__name__", str(tp))


def _default_text(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
    else:
        return "(required)"
    if isinstance(value, tuple):
        value = list(value)
    return repr(value).replace("'", '"') if not isinstance(value, bool) else str(value).lower()


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


def config_rows(cls: type, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """``(key, type, default, doc)`` for every leaf key under ``cls``, tables first-come."""
    hints = typing.get_type_hints(cls)
    docs = _field_docs(cls)
    rows: list[tuple[str, str, str, str]] = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        key = f"{prefix}{f.name}"
        tp = hints.get(f.name, f.type)
        sub = _dataclass_in(tp)
        scalar_too = sub is not None and any(a is not sub and a is not type(None) for a in typing.get_args(tp))
        if scalar_too:  # a value or a table, e.g. `bits = 8` or `bits = { forward = 4, backward = 8 }`
            rows.append((key, _type_text(tp), _default_text(f), docs.get(f.name, "")))
            rows.extend(config_rows(sub, key + "."))
        elif sub is not None:
            rows.append((f"[{key}]", "table", "", docs.get(f.name, "")))
            rows.extend(config_rows(sub, key + "."))
        else:
            rows.append((key, _type_text(tp), _default_text(f), docs.get(f.name, "")))
    return rows


def _import(spec: str) -> type | None:
    module, _, name = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def config_markdown() -> str:
    out: list[str] = []
    for heading, where, specs in CONFIG_ROOTS:
        cls = next((c for c in map(_import, specs) if c is not None), None)
        if cls is None:
            continue
        out += [f"## {heading}", "", f"Set in {where}. Unknown keys and wrong types are errors.", "",
                "| key | type | default | what it is |", "|---|---|---|---|"]
        for key, tp, default, doc in config_rows(cls):
            shown = f"**`{key}`**" if tp == "table" else f"`{key}`"
            out.append(f"| {shown} | {_cell(tp and f'`{tp}`')} | {_cell(default and f'`{default}`')} | {_cell(doc)} |")
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
