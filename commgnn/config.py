"""Strict mapping between TOML tables and frozen config dataclasses (a leaf module).

Every component owns a ``@dataclass(frozen=True, kw_only=True)`` config that validates
itself in ``__post_init__``. This module only moves values in and out of them:

* :func:`from_dict` builds a config from a (possibly nested) mapping. Unknown keys and
  values of the wrong type are :class:`~commgnn.errors.ConfigError` naming the full key
  path, e.g. ``model.hidden: expected int, got str ('16')``.
* :func:`to_dict` turns a config back into plain values, so the resolved config can be
  written beside the results and read back to the same object.
* :func:`load_toml` / :func:`dump_toml` read and write the files.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, TypeVar, Union, get_args, get_origin

from commgnn.errors import ConfigError, UserError

T = TypeVar("T")


def one_line(text: str) -> str:
    """``text`` with line breaks and other unprintable characters escaped (``\\n``, ``\\x1e``):
    a user error is printed as one line, and user input (a path, a TOML key) may hold them."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


F = TypeVar("F", bound=Callable[..., Any])


def one_line_errors(fn: F) -> F:
    """Decorator: a :class:`~commgnn.errors.UserError` raised by ``fn`` is re-raised (same
    type) with its message passed through :func:`one_line`."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except UserError as exc:
            text = str(exc)
            if text.isprintable():
                raise
            raise type(exc)(one_line(text)) from exc.__cause__

    return wrapper  # type: ignore[return-value]


def _type_name(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if dataclasses.is_dataclass(tp):
        return "a table"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, path: str, build: bool = True) -> Any:
    """Check ``value`` against annotation ``tp``; return it (ints widen to float).

    With ``build=False`` tables are only checked (keys and value types, recursively) and
    returned as they are: no config object is constructed, so no cross-field validation runs.
    """
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        # A table given where one arm is a config table is meant for that table: when only
        # that arm could take it, its own error (naming the inner key) is the one to report.
        deep: list[ConfigError] = []
        for arm in get_args(tp):
            if arm is type(None):
                if value is None:
                    return None
                continue
            try:
                return _coerce(value, arm, path, build)
            except ConfigError as exc:
                if dataclasses.is_dataclass(arm) and isinstance(value, Mapping):
                    deep.append(exc)
        if len(deep) == 1:
            raise deep[0]
        arms = " or ".join(_type_name(a) for a in get_args(tp) if a is not type(None))
        raise ConfigError(f"{path}: expected {arms}, got {type(value).__name__} ({value!r})")
    if origin is Literal:
        if value not in get_args(tp):
            choices = ", ".join(repr(a) for a in get_args(tp))
            raise ConfigError(f"{path}: {value!r} is not one of {choices}")
        return value
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: expected a list, got {type(value).__name__} ({value!r})")
        (item_tp, *_rest) = get_args(tp) or (Any,)
        return tuple(_coerce(v, item_tp, f"{path}[{i}]", build) for i, v in enumerate(value))
    if dataclasses.is_dataclass(tp):
        if dataclasses.is_dataclass(value) and isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: expected a table, got {type(value).__name__} ({value!r})")
        if not build:
            _checked_fields(tp, value, path, build=False)  # type: ignore[arg-type]
            return value
        return from_dict(tp, value, path=path)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true/false, got {type(value).__name__} ({value!r})")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected int, got {type(value).__name__} ({value!r})")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: expected float, got {type(value).__name__} ({value!r})")
        try:
            return float(value)
        except OverflowError:  # TOML ints have no size limit in tomllib
            raise ConfigError(f"{path}: integer too large for a float ({value.bit_length()} bits)") from None
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected string, got {type(value).__name__} ({value!r})")
        return value
    return value


def _checked_fields(cls: type, data: Mapping[str, Any], path: str, *, build: bool) -> dict[str, Any]:
    """``data``'s values checked against ``cls``'s fields (unknown keys are errors)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path or 'config'}: expected a table, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = f"{path}." if path else ""
        known = ", ".join(sorted(fields))
        raise ConfigError(f"unknown config key '{where}{unknown[0]}' (known keys here: {known})")
    kwargs = {}
    for name, value in data.items():
        key = f"{path}.{name}" if path else name
        kwargs[name] = _coerce(value, hints[name], key, build)
    return kwargs


@one_line_errors
def check_dict(cls: type, data: Mapping[str, Any], *, path: str = "") -> None:
    """Check ``data`` against dataclass ``cls`` without building it: unknown keys and values
    of the wrong type (at any depth) are :class:`ConfigError` naming the key. Value ranges
    and settings that only make sense together are left to :func:`from_dict`, so a partial
    table (a file that flags complete) passes."""
    _checked_fields(cls, data, path, build=False)


@one_line_errors
def from_dict(cls: type[T], data: Mapping[str, Any], *, path: str = "") -> T:
    """Build dataclass ``cls`` from ``data``, rejecting unknown keys and wrong types."""
    kwargs = _checked_fields(cls, data, path, build=True)
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        if path and not str(exc).startswith(path):
            raise ConfigError(f"{path}.{exc}") from None
        raise
    except TypeError as exc:  # a required field is missing
        raise ConfigError(f"{path or 'config'}: {exc}") from None


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain-value view of a config dataclass (``None`` fields are left out: TOML has no null)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if value is None:
            continue
        if dataclasses.is_dataclass(value):
            value = to_dict(value)
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def replace_path(cfg: T, dotted: str, value: Any) -> T:
    """Return ``cfg`` with the field at ``a.b.c`` replaced (validated again)."""
    head, _, rest = dotted.partition(".")
    names = {f.name for f in dataclasses.fields(cfg)}
    if head not in names:
        raise ConfigError(f"unknown config key '{dotted}'")
    if rest:
        value = replace_path(getattr(cfg, head), rest, value)
    else:
        hints = typing.get_type_hints(type(cfg))
        value = _coerce(value, hints[head], dotted)
    return dataclasses.replace(cfg, **{head: value})


def set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``a.b.c`` in a nested plain dict, creating tables on the way. Overrides are
    gathered this way and validated once by :func:`from_dict`, so that settings that only
    make sense together (``bits = "adaptive"`` with ``budget_mb``) can come from flags."""
    *heads, leaf = dotted.split(".")
    for head in heads:
        sub = data.get(head)
        if not isinstance(sub, dict):
            sub = data[head] = {}
        data = sub
    data[leaf] = value


@one_line_errors
def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file, turning I/O and syntax problems into one-line config errors."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {p}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {p}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {p} is not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:  # tomllib decodes the bytes itself
        raise ConfigError(f"config file {p} is not valid TOML: not UTF-8 text (byte {exc.start}: "
                          f"{exc.object[exc.start:exc.start + 1]!r})") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits (int() refuses it)
        raise ConfigError(f"config file {p} is not valid TOML: {' '.join(str(exc).split())[:200]}") from None
    except RecursionError:  # arrays or inline tables nested thousands deep
        raise ConfigError(f"config file {p} is not valid TOML: nested too deeply") from None


def load_checked_toml(cls: type, path: str | Path) -> dict[str, Any]:
    """Read a TOML file and check it against dataclass ``cls`` (:func:`check_dict`): unknown
    keys and wrong types are one-line config errors naming the file and the key."""
    data = load_toml(path)
    try:
        check_dict(cls, data)
    except ConfigError as exc:
        raise ConfigError(f"config file {path}: {exc}") from None
    return data


def dump_toml(data: Mapping[str, Any]) -> str:
    """Serialise nested plain values to TOML text (tables after scalars, as TOML requires)."""
    import tomli_w

    return tomli_w.dumps(dict(data))


def _finite(name: str, value: int | float) -> None:
    """Raise a :class:`ConfigError` for NaN and infinities (which slip through ``<`` tests:
    ``nan < 0`` is False) and for values that are not numbers at all."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name} must be a number, got {type(value).__name__} ({value!r:.60})")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got {value}")


def positive(name: str, value: int | float, *, allow_zero: bool = False) -> None:
    """Raise a :class:`ConfigError` unless ``value`` is a finite number > 0 (or >= 0 with
    ``allow_zero``); NaN and infinities are refused."""
    _finite(name, value)
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{name} must be {bound}, got {value}")


def fraction(name: str, value: float, *, open_low: bool = False, open_high: bool = False) -> None:
    """Raise a :class:`ConfigError` unless ``value`` lies in [0, 1] (ends optionally open);
    NaN is refused."""
    _finite(name, value)
    low_ok = value > 0 if open_low else value >= 0
    high_ok = value < 1 if open_high else value <= 1
    if not (low_ok and high_ok):
        lo = "(0" if open_low else "[0"
        hi = "1)" if open_high else "1]"
        raise ConfigError(f"{name} must lie in {lo}, {hi}, got {value}")


def deprecated_names(module: str, names: Mapping[str, tuple[Callable[[], Any], str]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for names kept one release after a rename: ``names`` maps each
    old name to (a function giving its value, what to use instead). Reading one warns
    (``DeprecationWarning``); any other unknown name is an ``AttributeError``."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value, instead = names[name]
        import warnings

        warnings.warn(f"{module}.{name} is deprecated and goes in the next release: use {instead}",
                      DeprecationWarning, stacklevel=2)
        return value()

    return __getattr__
