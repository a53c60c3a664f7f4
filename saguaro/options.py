"""Command-line options generated from the settings dataclasses, so each setting is defined once.

A dataclass field declared with :func:`opt` carries its help text (and, where needed, extra flags
and a parser); :func:`add_options` turns every such field into an argparse option whose type,
choices (from a ``Literal`` annotation) and default come from the field itself, and
:func:`from_args` builds the dataclass from what was given. An option left out on the command
line is not passed, so the dataclass default applies: the CLI never restates a default.

A field also says where its option is listed: its help group (:data:`GROUPS`), and whether it is
``advanced``: an :class:`OptionParser`'s ``--help`` lists the common options and points to
``--help-all``, which lists every one.
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

# Help groups, listed in this order (a command's own groups follow them).
BASIC = "basic"
SAMPLING = "sampling"
SPECULATION = "speculation"
SSD = "SSD (mode ssd, and auto)"
PLACEMENT = "placement"
MEMORY = "batching and KV cache"
KERNELS = "precision and kernels"
GROUPS: tuple[str, ...] = (BASIC, SAMPLING, SPECULATION, SSD, PLACEMENT, MEMORY, KERNELS)
HELP_ALL = "--help-all"


@dataclass(frozen=True)
class Option:
    help: str
    flags: tuple[str, ...] = ()  # extra spellings, e.g. a short alias
    parse: Callable[[str], Any] | None = None  # str -> value, where the type is not a plain one
    metavar: str | None = None
    repeat: bool = False  # the option may be given several times; the field gets the list
    several: bool = False  # the option takes one or more space-separated values (a tuple)
    group: str | None = None  # its help group (None: the one add_options is given)
    advanced: bool = False  # rarely needed: listed by --help-all only


def opt(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    flags: tuple[str, ...] = (),
    parse: Callable[[str], Any] | None = None,
    metavar: str | None = None,
    repeat: bool = False,
    several: bool = False,
    group: str | None = None,
    advanced: bool = False,
    default_factory: Any = dataclasses.MISSING,
) -> Any:
    """A dataclass field that is also a command-line option."""
    option = Option(
        help,
        flags=flags,
        parse=parse,
        metavar=metavar,
        repeat=repeat,
        several=several,
        group=group,
        advanced=advanced,
    )
    meta = {_OPTION: option}
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


class _HelpAll(argparse.Action):
    """``--help-all``: the help with the advanced options listed too, then exit."""

    def __init__(self, option_strings: list[str], dest: str, help: str | None = None) -> None:
        super().__init__(
            option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, help=help
        )

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if isinstance(parser, OptionParser):
            parser.show_all()
        parser.print_help()
        parser.exit()


class OptionParser(argparse.ArgumentParser):
    """A command's parser: options listed in help groups (:data:`GROUPS` first, in that order);
    ``--help`` leaves the advanced ones out and ends with a pointer to ``--help-all``, which
    lists every one. Every option parses either way."""

    def __init__(self, **kwargs: Any) -> None:
        # argparse's usage line would spell out every option, pages of them: --help lists them
        kwargs.setdefault("usage", "%(prog)s [options]")
        super().__init__(**kwargs)
        self.hidden: dict[argparse.Action, str] = {}  # advanced options -> their help text
        self.add_argument(HELP_ALL, action=_HelpAll, help="show every option, and exit")
        for title in GROUPS:  # made now, so they are listed in this order (empty ones are not)
            self.group(title)

    def group(self, title: str) -> argparse._ArgumentGroup:
        """The help group of that title, made on first use."""
        for g in self._action_groups:
            if g.title == title:
                return g
        return self.add_argument_group(title)

    def hide(self, action: argparse.Action) -> None:
        """Leave ``action`` out of ``--help`` (``--help-all`` lists it)."""
        self.hidden[action] = action.help or ""
        action.help = argparse.SUPPRESS

    def show_all(self) -> None:
        """List the advanced options too (``--help-all``)."""
        for action, text in self.hidden.items():
            action.help = text
        self.hidden.clear()

    def format_help(self) -> str:
        text = super().format_help()
        return text + f"\nmore options: {self.prog} {HELP_ALL}\n" if self.hidden else text


def _parsing(o: Option, hint: Any) -> dict[str, Any]:
    """How argparse reads an option of that field type: its action, type, nargs or choices."""
    allowed = choices(hint)
    scalar = _scalar(hint)
    if o.repeat:
        return {"action": "append", "type": o.parse or str}
    if o.several:
        return {"nargs": "+", "type": o.parse or str}
    if scalar is bool:
        return {"action": argparse.BooleanOptionalAction}
    if allowed is not None:
        return {"choices": allowed}
    if o.parse is not None:
        return {"type": o.parse}
    if scalar in (int, float, str):
        return {"type": scalar}
    return {"type": str}  # a union of several types (e.g. str | list[int]): the dataclass parses


def add_options(
    parser: OptionParser,
    cls: type,
    *,
    only: Iterable[str] | None = None,
    exclude: Iterable[str] = (),
    defaults: dict[str, Any] | None = None,
    group: str | None = None,
) -> None:
    """Add one option per :func:`opt` field of ``cls``, in the field's help group (else
    ``group``, else the parser's own options), hidden from ``--help`` where it is advanced.
    ``defaults`` overrides a field's default for this command (shown in the help, and passed to
    the dataclass)."""
    hints = typing.get_type_hints(cls)
    defaults = defaults or {}
    for f in _fields(cls, only, exclude):
        o: Option = f.metadata[_OPTION]
        default = defaults.get(f.name, f.default)
        shown = "" if default in (dataclasses.MISSING, None) else f" (default: {show(default)})"
        kwargs: dict[str, Any] = {
            "dest": f.name,
            "help": o.help + shown,
            "default": defaults.get(f.name),  # None: not given, the dataclass's default applies
            **_parsing(o, hints[f.name]),
        }
        if o.metavar:
            kwargs["metavar"] = o.metavar
        title = o.group or group
        action = (parser.group(title) if title else parser).add_argument(
            flag(f.name), *o.flags, **kwargs
        )
        if o.advanced:
            parser.hide(action)


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
