"""Each option declared once: a config root's fields and one table of flag details make
the command-line flags, the ``--help`` text, the flag-to-key map, the ``--resume`` list,
the Python keyword options and the configuration reference (a leaf module).

A config root (``RunConfig``, ``FederateConfig``, ``ClusterConfig``, ...) is a tree of
frozen dataclasses; each leaf field is one option, with its type, default and docstring
declared on the field. An :class:`OptionSet` pairs the root with a table of
:class:`Option` entries, one per option that needs more than the field says (a flag name
kept from an earlier release, a short help, a parser such as ``15,10`` -> ``[15, 10]``,
whether it may change on ``--resume``). Every leaf without an entry gets one generated from
its field: keyword ``name`` (or ``<table>_name`` where that is ambiguous) and flag
``--name``. So a field added to a config is reachable from TOML, the command line and
Python at once, and a flag can only set a field that exists (:meth:`OptionSet.check`).

Resolution is the same for every root (:meth:`OptionSet.resolve`): the TOML file (checked
on its own, strictly), then the options given (flags or keywords), then
``COMMGNN_DATA_ROOT`` where the root has a ``data.root`` left unset.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import textwrap
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Literal, Mapping, Sequence, Union, get_args, get_origin

from commgnn.config import from_dict, load_checked_toml, replace_path, set_path, to_dict
from commgnn.errors import ConfigError, UserError


@dataclass(frozen=True)
class Option:
    """One option: the config key(s) it sets, its Python keyword and argparse ``dest``, its
    flag, and how the flag reads its text."""

    key: str
    """Dotted config key, e.g. ``train.epochs``."""
    dest: str
    """Python keyword of the API and argparse ``dest`` (``epochs``)."""
    flag: str | None
    """Command-line flag (``--epochs``); None: TOML and Python only."""
    help: str | None = None
    """Short help; None: the field docstring's first sentence."""
    parse: Callable[[str], Any] | None = None
    """Reads the flag's text (argparse ``type``); None: from the field's type."""
    const: Any = None
    """The flag takes no value and sets this one (``--precompute`` -> True)."""
    negatable: bool = False
    """A ``--x`` / ``--no-x`` pair (argparse's ``BooleanOptionalAction``)."""
    resume: bool = False
    """May change when a run is continued (``commgnn train --resume``)."""
    also: tuple[str, ...] = ()
    """Further keys set to the same value (federate's ``--seed``: the split's and the run's)."""
    choices: tuple[Any, ...] | None = None
    """Values the flag accepts (argparse checks them); None: the config checks."""
    metavar: str | None = None
    """Name of the value in ``--help``."""
    show: Callable[[Any], str] | None = None
    """The default as users write it (``1gbit`` for 1e9 bits/s); None: :func:`default_text`."""
    generated: bool = False
    """Made from the field alone (no table entry): its flag checks a ``Literal``'s choices."""

    @property
    def keys(self) -> tuple[str, ...]:
        """Every config key the option sets."""
        return (self.key, *self.also)


def opt(key: str, flag: str | None = None, help: str | None = None, *, dest: str | None = None,
        **details: Any) -> Option:
    """An :class:`Option` for ``key``: ``dest`` defaults to the flag's name (``--maxk-k`` ->
    ``maxk_k``), else the key's last part."""
    if dest is None:
        dest = flag.lstrip("-").replace("-", "_") if flag else key.rsplit(".", 1)[-1]
    return Option(key=key, dest=dest, flag=flag, help=help, **details)


# ------------------------------------------------------------------ fields and their docstrings
@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """``{field: docstring}`` of dataclass ``cls`` (and its dataclass bases): the string
    literal written right after each field, read once from the source with :mod:`ast`."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass) or klass is object:
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        node = ast.parse(source).body[0]
        if not isinstance(node, ast.ClassDef):
            continue
        body = node.body
        for i, st in enumerate(body[:-1]):
            nxt = body[i + 1]
            if (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and isinstance(nxt, ast.Expr)
                    and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
                docs[st.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


def first_sentence(text: str) -> str:
    """The first sentence of a docstring, on one line, without reST markup."""
    text = " ".join(text.split()).replace("``", "").replace(":class:", "").replace(":func:", "")
    text = text.replace(":mod:", "").replace("`", "")
    for end in (". ", "; "):
        head, sep, _ = text.partition(end)
        if sep and len(head) > 20:
            return head
    return text.rstrip(".")


def _lower_first(text: str) -> str:
    """``Number of nodes`` -> ``number of nodes`` (``METIS ...`` and ``L2 ...`` stay)."""
    word = text.split(" ", 1)[0]
    return text[:1].lower() + text[1:] if len(word) == 1 or word[1:].islower() else text


def _table(tp: Any) -> type | None:
    """The dataclass a field's annotation holds as a table (``X`` or ``X | None``); None for
    a leaf (a scalar, or a union with a scalar such as ``int | BitsConfig``)."""
    if dataclasses.is_dataclass(tp):
        return tp  # type: ignore[return-value]
    if get_origin(tp) in (Union, types.UnionType):
        arms = [a for a in get_args(tp) if a is not type(None)]
        if len(arms) == 1 and dataclasses.is_dataclass(arms[0]):
            return arms[0]  # type: ignore[no-any-return]
    return None


@dataclass(frozen=True)
class Leaf:
    """A leaf field of a config root."""

    key: str
    """Dotted key."""
    annotation: Any
    """Its type annotation (resolved)."""
    owner: type
    """The dataclass that declares it."""

    @property
    def name(self) -> str:
        return self.key.rsplit(".", 1)[-1]

    @property
    def doc(self) -> str:
        return field_docs(self.owner).get(self.name, "")


def tables(root: type, prefix: str = "") -> Iterator[tuple[str, type]]:
    """``(dotted path, dataclass)`` of ``root`` and of every table below it, depth first."""
    yield prefix, root
    hints = typing.get_type_hints(root)
    for f in dataclasses.fields(root):
        sub = _table(hints[f.name])
        if sub is not None and f.init:
            yield from tables(sub, f"{prefix}{f.name}.")


def leaves(root: type) -> list[Leaf]:
    """Every leaf field of ``root``, in declaration order."""
    out = []
    for path, cls in tables(root):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.init and _table(hints[f.name]) is None:
                out.append(Leaf(f"{path}{f.name}", hints[f.name], cls))
    return out


def default_text(value: Any) -> str:
    """A default as users write it: ``15,10`` (not ``(15, 10)``), on/off, ``none``, ``0.01``."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (tuple, list)):
        return ",".join(default_text(v) for v in value) if value else "none"
    if isinstance(value, Mapping):
        return ",".join(default_text(v) for v in value.values()) if value else "none"
    if dataclasses.is_dataclass(value):
        return default_text(to_dict(value))
    return str(value)


def type_text(tp: Any) -> str:
    """A field's type as the reference prints it: ``int``, ``'cut' | 'vol'``, ``list of int``,
    ``float or none``, ``a table``."""
    origin = get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        arms = [a for a in get_args(tp) if a is not type(None)]
        text = " or ".join(type_text(a) for a in arms)
        return f"{text} or none" if len(arms) < len(get_args(tp)) else text
    if origin in (tuple, list):
        return f"list of {type_text(get_args(tp)[0])}" if get_args(tp) else "list"
    if origin is dict or tp is dict:
        return "a table"
    if dataclasses.is_dataclass(tp):
        return "a table"
    return getattr(tp, "__name__", str(tp))


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _argparse_type(tp: Any) -> tuple[Callable[[str], Any] | None, tuple[Any, ...] | None]:
    """(argparse ``type``, ``choices``) for a field's annotation."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        arms = [a for a in get_args(tp) if a is not type(None)]
        if len(arms) == 1:
            return _argparse_type(arms[0])
        return str, None
    if origin is Literal:
        values = get_args(tp)
        return (type(values[0]) if values else str), values
    if origin in (tuple, list):
        return _int_list, None
    if tp in (int, float, str):
        return tp, None
    return str, None


def _is_bool(tp: Any) -> bool:
    if tp is bool:
        return True
    return get_origin(tp) in (Union, types.UnionType) and [a for a in get_args(tp) if a is not type(None)] == [bool]


# ------------------------------------------------------------------ an option set
class OptionSet:
    """The options of one config root: the explicit table, completed with a generated
    option for every other leaf field.

    Args:
        name: the root's name in the reference (``run``, ``federate``, ...).
        root: a callable giving the root dataclass (called once, when first needed, so that
            declaring a set imports nothing heavy).
        table: the explicit options.
        prefixes: ``{table path: keyword prefix}`` for generated options (``comm.grad`` ->
            ``grad_``); a table without one gives bare names, and a name two leaves would
            share becomes ``<table>_<name>``.
        no_flag: key prefixes whose generated options get no flag (TOML and Python only).
        groups: ``{first key part: depth}``: ``--help`` lists flags under their table, the
            key's first part (``[train]``) or, for a part listed here, its first ``depth``
            parts (``{"comm": 2}``: ``[comm.halo]``).
    """

    def __init__(self, name: str, root: Callable[[], type], table: Sequence[Option], *,
                 prefixes: Mapping[str, str] | None = None, no_flag: Sequence[str] = (),
                 groups: Mapping[str, int] | None = None) -> None:
        self.name = name
        self._root = root
        self.table = tuple(table)
        self.prefixes = dict(prefixes or {})
        self.no_flag = tuple(no_flag)
        self.groups = dict(groups or {})

    @functools.cached_property
    def root(self) -> type:
        """The root dataclass."""
        return self._root()

    @functools.cached_property
    def leaves(self) -> dict[str, Leaf]:
        """Every leaf field of the root by dotted key."""
        return {leaf.key: leaf for leaf in leaves(self.root)}

    @functools.cached_property
    def options(self) -> tuple[Option, ...]:
        """The explicit options, then one generated per leaf field they leave out."""
        covered = {k for o in self.table for k in o.keys}
        taken = {o.dest for o in self.table}
        todo = [leaf for key, leaf in self.leaves.items() if key not in covered]

        def prefixed(leaf: Leaf) -> str:
            path = leaf.key.rpartition(".")[0]
            return self.prefixes.get(path, "") + leaf.name

        first = [prefixed(leaf) for leaf in todo]
        counts = {n: first.count(n) for n in first}
        generated = []
        for leaf, name in zip(todo, first):
            if name in taken or counts[name] > 1:  # ambiguous: name it by its table
                parent = leaf.key.rpartition(".")[0].rsplit(".", 1)[-1]
                name = f"{parent}_{leaf.name}"
            flag = None if leaf.key.startswith(self.no_flag) and self.no_flag else "--" + name.replace("_", "-")
            generated.append(Option(key=leaf.key, dest=name, flag=flag, negatable=_is_bool(leaf.annotation),
                                    generated=True))
        return (*self.table, *generated)

    @functools.cached_property
    def by_dest(self) -> dict[str, Option]:
        """Options by Python keyword / argparse dest."""
        return {o.dest: o for o in self.options}

    @property
    def flag_keys(self) -> dict[str, str]:
        """``{dest: dotted key}`` (the first key of an option that sets several)."""
        return {o.dest: o.key for o in self.options}

    @property
    def resume_dests(self) -> tuple[str, ...]:
        """The options that may change when a run is continued."""
        return tuple(o.dest for o in self.options if o.resume)

    def check_resume(self, given: Mapping[str, Any]) -> None:
        """Refuse, in one line (:class:`~commgnn.errors.UserError`), options that may not
        change when a run is continued: ``given`` maps option dests (Python keywords) to
        values, None meaning not given; ``"config"`` stands for ``--config``. The line names
        the first such option by its flag and lists those that may change."""
        allowed = set(self.resume_dests)
        other = sorted(k for k, v in given.items() if v is not None and k not in allowed)
        if not other:
            return
        o = self.by_dest.get(other[0])
        name = (o.flag or o.dest) if o is not None else "--" + other[0].replace("_", "-")
        names = [o.flag.replace("--", "--[no-]") if o.negatable else o.flag
                 for o in self.options if o.dest in allowed and o.flag]
        only = f"{', '.join(names[:-1])} and {names[-1]}" if len(names) > 1 else "".join(names)
        raise UserError(f"--resume continues the run as its config.toml says: {name} cannot be given with it "
                        f"(only {only} may change)")

    def check(self) -> None:
        """Every option names a leaf field, once; dests and flags are distinct. A
        :class:`ValueError` (a programming error) names the first fault."""
        seen_keys: dict[str, str] = {}
        for o in self.options:
            for key in o.keys:
                if key not in self.leaves:
                    raise ValueError(f"{self.name} option {o.dest!r} sets {key!r}, which is no leaf field")
                if key in seen_keys:
                    raise ValueError(f"{self.name}: {key!r} is set by both {seen_keys[key]!r} and {o.dest!r}")
                seen_keys[key] = o.dest
        dests = [o.dest for o in self.options]
        flags = [o.flag for o in self.options if o.flag]
        for what, names in (("keyword", dests), ("flag", flags)):
            dup = {n for n in names if names.count(n) > 1}
            if dup:
                raise ValueError(f"{self.name}: {what} {sorted(dup)[0]!r} is declared twice")

    # -------------------------------------------------------------- defaults and help
    @functools.cached_property
    def _defaults(self) -> Any:
        return self.root()

    def default(self, key: str) -> Any:
        """Default of ``key`` in a default root. A table that is off by default
        (``comm.gossip``) answers with its own defaults; a value that ``__post_init__``
        widens into a table (``comm.halo.bits = 32``) answers as declared."""
        obj: Any = self._defaults
        *heads, leaf = key.split(".")
        for head in heads:
            if not dataclasses.is_dataclass(obj) or head not in {f.name for f in dataclasses.fields(obj)}:
                raise KeyError(key)
            value = getattr(obj, head)
            if value is None:  # an optional table: its defaults
                table = _table(typing.get_type_hints(type(obj))[head])
                if table is None:
                    raise KeyError(key)
                value = table()
            obj = value
        fields = {f.name: f for f in dataclasses.fields(obj)}
        if leaf not in fields:
            raise KeyError(key)
        value = getattr(obj, leaf)
        declared = fields[leaf].default
        if dataclasses.is_dataclass(value) and declared is not dataclasses.MISSING:
            return declared
        return value

    def help_text(self, o: Option) -> str:
        """The option's ``--help`` line: its help (or the field docstring's first sentence)
        and its default as users write it, unless the help says its own ``default:``."""
        text = o.help or _lower_first(first_sentence(self.leaves[o.key].doc)) or o.key
        value = self.default(o.key)
        if "default:" in text or (value is None and "(required)" in text):
            return text
        return f"{text} (default: {(o.show or default_text)(value)})"

    def group_of(self, o: Option) -> str:
        """The table an option's flag is listed under in ``--help``: the key's first part
        (``train``), or its first ``groups[first part]`` parts (``comm.halo``)."""
        parts = o.key.split(".")
        depth = min(self.groups.get(parts[0], 1), len(parts) - 1)
        return ".".join(parts[:depth]) if depth else ""

    def table_doc(self, path: str) -> str:
        """The first sentence of the docstring of table ``path``'s field (``comm.halo``),
        without its leading ``[table]:`` label."""
        cls, doc = self.root, ""
        for part in path.split(".") if path else []:
            doc = field_docs(cls).get(part, "")
            sub = _table(typing.get_type_hints(cls).get(part))
            if sub is None:
                break
            cls = sub
        doc = first_sentence(doc) if doc else ""
        head, sep, rest = doc.partition(":")
        return rest.strip() if sep and head.startswith("[") else doc

    def add_arguments(self, parser: argparse.ArgumentParser, *,
                      only: Callable[[Option], bool] | None = None) -> None:
        """Add a flag for each option (that ``only`` keeps), grouped by config table
        (``[comm.halo]``: its docstring), each help line ending in the default as users
        write it."""
        chosen = [o for o in self.options if o.flag is not None and (only is None or only(o))]
        order = [path.rstrip(".") for path, _ in tables(self.root)]
        paths = sorted({self.group_of(o) for o in chosen}, key=lambda p: order.index(p) if p in order else -1)
        groups = {path: parser.add_argument_group(f"[{path}]", self.table_doc(path) or None) if path else parser
                  for path in paths}  # in the root's order of tables; a flat root's flags join the parser's
        for o in chosen:
            self.add_flag(groups[self.group_of(o)], o)

    def add_flag(self, parser: Any, o: Option, flag: str | None = None) -> None:
        """Add option ``o``'s flag (or ``flag`` in its place) to ``parser`` (or a group)."""
        help_text = self.help_text(o).replace("%", "%%")  # argparse %-formats help
        name = flag or o.flag
        if o.negatable:
            parser.add_argument(name, dest=o.dest, action=argparse.BooleanOptionalAction, default=None,
                                help=help_text)
        elif o.const is not None:
            parser.add_argument(name, dest=o.dest, action="store_const", const=o.const, help=help_text)
        else:
            parse, choices = o.parse, o.choices
            if parse is None:
                parse, literal = _argparse_type(self.leaves[o.key].annotation)
                if o.generated and choices is None:  # a declared flag leaves the check to the config
                    choices = literal
            metavar = o.metavar or (flag.lstrip("-").replace("-", "_").upper() if flag else None)
            tp = self.leaves[o.key].annotation
            if o.parse is None and get_origin(tp) in (tuple, list) and get_args(tp)[:1] == (str,):
                parser.add_argument(name, dest=o.dest, nargs="+", metavar=metavar, help=help_text)  # names
                return
            parser.add_argument(name, dest=o.dest, type=parse, choices=choices, metavar=metavar, help=help_text)

    # -------------------------------------------------------------- values in, config out
    def overrides(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """Nested plain dict of the options ``given`` (``{dest: value}``; None = not given)."""
        data: dict[str, Any] = {}
        for dest, value in given.items():
            if value is None:
                continue
            for key in self.by_dest[dest].keys:
                set_path(data, key, value)
        return data

    def unknown(self, names: Sequence[str], what: str) -> None:
        """A :class:`ConfigError` for the first name that is no option (``what`` says whose)."""
        bad = sorted(set(names) - set(self.by_dest))
        if bad:
            raise ConfigError(f"unknown option {bad[0]!r}; options are {what}: {', '.join(sorted(self.by_dest))}")

    def resolve(self, toml_path: str | None, given: Mapping[str, Any], env: Mapping[str, str], *,
                start: Any = None, adjust: Callable[[dict[str, Any]], None] | None = None) -> Any:
        """The one resolver: ``start`` (a config object) or the TOML file (checked on its
        own, strictly, so that an option cannot hide a mistake in it), then the options
        ``given`` (``{dest: value}``, None = not given), then ``COMMGNN_DATA_ROOT`` when the
        root has a ``data.root`` left unset. ``adjust`` may change the merged plain values
        before the config is built and validated, once."""
        data: dict[str, Any] = {}
        if start is not None:
            data = to_dict(start)
        elif toml_path:
            data = load_checked_toml(self.root, toml_path)
        for dest, value in given.items():
            if value is None:
                continue
            for key in self.by_dest[dest].keys:
                set_path(data, key, value)
        if adjust is not None:
            adjust(data)
        cfg = from_dict(self.root, data)
        if "data.root" in self.leaves and env.get("COMMGNN_DATA_ROOT") and cfg.data.root is None:
            cfg = replace_path(cfg, "data.root", env["COMMGNN_DATA_ROOT"])
        return cfg

    def reference(self) -> list[dict[str, str]]:
        """One row per option for the configuration reference: ``key``, ``keyword``, ``flag``,
        ``type``, ``default`` (as users write it) and ``help`` (the field docstring)."""
        rows = []
        for o in self.options:
            for key in o.keys:
                leaf = self.leaves[key]
                flag = o.flag or ""
                if o.negatable and flag:
                    flag = f"{flag} / --no-{flag[2:]}"
                rows.append({"key": key, "keyword": o.dest, "flag": flag, "type": type_text(leaf.annotation),
                             "default": (o.show or default_text)(self.default(key)),
                             "help": " ".join(leaf.doc.split())})
        return rows
