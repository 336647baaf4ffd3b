"""Command-line flags generated from config dataclasses: one ``--flag`` per documented field (the
field's docstring is its help), so a method's settings reach ``vla rl`` without a line of CLI code.

A field's flag is ``--`` + its name with dashes; ``metadata`` may give ``flag`` (another name),
``choices``, ``metavar``, ``help_default`` (what the default says instead of the value). Nested
dataclass fields are flattened into their own names (``Config.inner.lr`` -> ``--lr``); a
class lists fields it does not offer in ``NOT_FLAGS`` (dotted paths). Every generated flag
defaults to ``UNSET`` ("not given"), so that only what the user typed replaces a config's value
(``--init-log-std none`` gives None).
No torch here.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import textwrap
from typing import Any


class _Unset:
    def __repr__(self) -> str:
        return "(not given)"

    def __bool__(self) -> bool:
        return False


UNSET = _Unset()
"""The default of every generated flag: not given on the command line (falsy)."""


@functools.lru_cache(maxsize=None)
def field_docs(cls: type) -> dict[str, str]:
    """{field name: its docstring (the string literal after the field), whitespace collapsed}."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):  # no source (e.g. a class made at run time)
        return {}
    body = tree.body[0].body
    docs = {}
    for a, b in zip(body, body[1:]):
        if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name) and isinstance(b, ast.Expr) \
                and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str):
            docs[a.target.id] = " ".join(b.value.value.split())
    return docs


def _kind(f: dataclasses.Field) -> tuple[str, bool]:
    """(base type name, optional) from the field's annotation (a string under ``from __future__
    import annotations``): ``int | None`` -> ("int", True)."""
    t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    parts = [p.strip() for p in t.split("|")]
    optional = "None" in parts
    base = next((p for p in parts if p != "None"), "str")
    return base, optional


def _none_or(conv):
    def parse(text: str):
        return None if text.lower() == "none" else conv(text)

    parse.__name__ = conv.__name__
    return parse


@dataclasses.dataclass
class Flag:
    dest: str
    """The ``argparse`` destination (the field's flat name)."""
    flag: str
    owner: type
    append: bool = False


def flat_flag_fields(cls: type, prefix: str = "") -> list[tuple[str, dataclasses.Field, type]]:
    """(dotted path, field, owning class) of every field that becomes a flag."""
    skip = set(getattr(cls, "NOT_FLAGS", ()))
    out = []
    for f in dataclasses.fields(cls):
        path = prefix + f.name
        if path in skip or f.metadata.get("flag") is False:
            continue
        if dataclasses.is_dataclass(f.default):
            sub = flat_flag_fields(type(f.default))
            out += [(f"{path}.{p}", ff, owner) for p, ff, owner in sub if f"{path}.{p}" not in skip]
        else:
            out.append((path, f, cls))
    return out


def add_flags(parser, cls: type, skip: tuple[str, ...] = (), existing: dict[str, Flag] | None = None,
              defaults: Any = None) -> dict[str, Flag]:
    """Add one flag per documented field of ``cls`` (not in ``skip``) to ``parser`` (a parser or an
    argument group). ``existing``: flags added before (a name shared by two configs is added once
    and fills both). ``defaults``: an instance whose values the help shows (default: ``cls()``).
    -> {flat name: Flag} of what this class reads."""
    existing = {} if existing is None else existing
    if defaults is None:
        try:
            defaults = cls()
        except TypeError:  # required fields: no instance to read defaults from
            defaults = None
    added: dict[str, Flag] = {}
    for path, f, owner in flat_flag_fields(cls):
        name = f.name
        if path in skip or name in skip:
            continue
        if name in existing:
            added[name] = existing[name]
            continue
        flag = f.metadata.get("flag") or "--" + name.replace("_", "-")
        help_ = field_docs(owner).get(name, "")
        default = _default_at(defaults, path) if defaults is not None else f.default
        if "help_default" in f.metadata:
            help_ += f" (default: {f.metadata['help_default']})"
        elif default is not dataclasses.MISSING and default not in (None, (), ""):
            shown = " ".join(map(str, default)) if isinstance(default, tuple) else default
            help_ += f" (default: {shown})"
        kw: dict[str, Any] = {"dest": name, "default": UNSET, "help": help_.replace("%", "%%")}
        base, optional = _kind(f)
        if base == "bool":
            kw["action"] = argparse.BooleanOptionalAction
        elif base.startswith("tuple["):
            elem = base[len("tuple["):].split(",")[0].strip()
            conv = {"int": int, "float": float}.get(elem, str)
            if f.metadata.get("metavar"):  # a repeatable flag, one value each time
                kw.update(action="append", type=conv, default=None)  # argparse appends to a list or None
            else:
                kw.update(nargs="+", type=conv)
        else:
            conv = {"int": int, "float": float}.get(base, str)
            kw["type"] = _none_or(conv) if optional and conv is not str else conv
            if optional and conv is not str:
                kw["metavar"] = f"{base.upper()}|none"
        if "choices" in f.metadata:
            kw["choices"] = list(f.metadata["choices"])
        if "metavar" in f.metadata:
            kw["metavar"] = f.metadata["metavar"]
        parser.add_argument(flag, **kw)
        added[name] = existing[name] = Flag(name, flag, owner, kw.get("action") == "append")
    return added


def _default_at(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def given(args: argparse.Namespace, flags: dict[str, Flag]) -> dict[str, Any]:
    """{flat name: value} of the flags in ``flags`` that were given on the command line."""
    out = {}
    for name in flags:
        v = getattr(args, name, UNSET)
        if v is UNSET or (v is None and flags[name].append):  # an append flag's default is None
            continue
        out[name] = tuple(v) if isinstance(v, list) else v
    return out
