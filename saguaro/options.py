"""Command-line options generated from the settings dataclasses, so each setting is defined once.

A dataclass field declared with :func:`opt` carries its help text (and, where needed, extra flags
and a parser); :func:`add_options` turns every such field into an argparse option whose type,
choices (from a ``Literal`` annotation) and default come from the field itself, and
:func:`from_args` builds the dataclass from what was given. An option left out on the command
line is not passed, so the dataclass default applies: the CLI never restates a default.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

_OPTION = "saguaro.option"


@dataclass(frozen=True)
class Option:
    help: str
    flags: tuple[str, ...] = ()  # extra spellings, e.g. a short alias
    parse: Callable[[str], Any] | None = None  # str -> value, where the type is not a plain one
    metavar: str | None = None
    repeat: bool = False  # the option may be given several times; the field gets the list
    several: bool = False  # the option takes one or more space-separated values (a tuple)


def opt(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    flags: tuple[str, ...] = (),
    parse: Callable[[str], Any] | None = None,
    metavar: str | None = None,
    repeat: bool = False,
    several: bool = False,
    default_factory: Any = dataclasses.MISSING,
) -> Any:
    """A dataclass field that is also a command-line option."""
    meta = {_OPTION: Option(help, flags, parse, metavar, repeat, several)}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def choices(hint: Any) -> tuple[Any, ...] | None:
    """The values a ``Literal`` annotation (optionally ``| None``) allows, else None."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is Literal:
        return typing.get_args(hint)
    if len(args) == 1 and typing.get_origin(args[0]) is Literal:
        return typing.get_args(args[0])
    return None


def check_choices(obj: Any) -> None:
    """Raise ValueError for a field of dataclass ``obj`` outside its ``Literal`` annotation."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        allowed = choices(hints[f.name])
        value = getattr(obj, f.name)
        if (
            allowed is not None
            and value not in allowed
            and not (value is None and type(None) in typing.get_args(hints[f.name]))
        ):
            raise ValueError(f"{f.name} must be one of {allowed}, got {value!r}")


def _scalar(hint: Any) -> Any:
    """int/float/str/bool from a hint such as ``int | None``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = args[0]
    return hint


def show(default: Any) -> str:
    """A default as the command line writes it: a tuple of values as ``1,2,4``."""
    return ",".join(map(str, default)) if isinstance(default, (tuple, list)) else str(default)


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _fields(cls: type, only: Iterable[str] | None, exclude: Iterable[str]) -> list[Any]:
    keep = None if only is None else set(only)
    skip = set(exclude)
    return [
        f
        for f in dataclasses.fields(cls)
        if _OPTION in f.metadata and (keep is None or f.name in keep) and f.name not in skip
    ]


def add_options(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    *,
    only: Iterable[str] | None = None,
    exclude: Iterable[str] = (),
    defaults: dict[str, Any] | None = None,
) -> None:
    """Add one option per :func:`opt` field of ``cls``. ``defaults`` overrides a field's default
    for this command (shown in the help, and passed to the dataclass)."""
    hints = typing.get_type_hints(cls)
    defaults = defaults or {}
    for f in _fields(cls, only, exclude):
        o: Option = f.metadata[_OPTION]
        hint = hints[f.name]
        default = defaults.get(f.name, f.default)
        shown = "" if default in (dataclasses.MISSING, None) else f" (default: {show(default)})"
        names = [flag(f.name), *o.flags]
        kwargs: dict[str, Any] = {"dest": f.name, "help": o.help + shown, "default": None}
        if f.name in defaults:
            kwargs["default"] = defaults[f.name]
        allowed = choices(hint)
        scalar = _scalar(hint)
        if o.repeat:
            kwargs.update(action="append", type=o.parse or str)
        elif o.several:
            kwargs.update(nargs="+", type=o.parse or str)
        elif scalar is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif allowed is not None:
            kwargs["choices"] = allowed
        elif o.parse is not None:
            kwargs["type"] = o.parse
        elif scalar in (int, float, str):
            kwargs["type"] = scalar
        else:  # a union of several types (e.g. str | list[int]): the dataclass parses the text
            kwargs["type"] = str
        if o.metavar:
            kwargs["metavar"] = o.metavar
        parser.add_argument(*names, **kwargs)


def given(cls: type, args: argparse.Namespace, **kw: Any) -> dict[str, Any]:
    """The :func:`opt` fields of ``cls`` that were given on the command line (or have a
    per-command default), as keyword arguments."""
    out = {
        f.name: tuple(value) if f.metadata[_OPTION].several else value
        for f in _fields(cls, None, ())
        if (value := getattr(args, f.name, None)) is not None
    }
    return {**out, **kw}


def from_args(cls: type, args: argparse.Namespace, **kw: Any) -> Any:
    """Build ``cls`` from the options given; ``kw`` sets fields the command line does not."""
    return cls(**given(cls, args, **kw))


def cpu_list(spec: str) -> list[int]:
    """Parse a core list such as ``0``, ``1,3`` or ``2-5``."""
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out
