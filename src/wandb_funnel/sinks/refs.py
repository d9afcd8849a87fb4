"""Media references in a row, made into what a sink writes: the walk every sink shares.

A worker sends a media value as a descriptor; the receiver decodes it to a ``MediaRef``
(``_protocol.messages``). A sink hands ``materialize`` a row and its ``make``: one call per
ref (``sinks.wandb.media`` makes wandb's objects, ``sinks.recording`` plain dicts). The walk
keeps what is generic: refs inside lists and dicts, a rank's counted drop (``"k":
"dropped"``), one object per staged file, and the accounting on ``Staging``. Nothing here
trusts a descriptor: a bad one costs its key (in a list: that element), counted and said.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from wandb_funnel._protocol.messages import MediaRef

if TYPE_CHECKING:
    from wandb_funnel.sinks import Staging

CONTAINERS = (MediaRef, dict, list)
# Staged names: ``{pid}-{seq}-{8 hex}{extension}`` (``.png``, ``.mask.png``, ``.boxes2D.json``).
STAGED = re.compile(r"[0-9]+-[0-9]+-[0-9a-f]{8}((?:\.[\w-]{1,32}){0,3})")


class BadMediaError(ValueError):
    """A descriptor this sink cannot turn into what it writes."""


class Absent(Exception):  # noqa: N818  (control flow: a value that is not logged)
    """A ref that stays out of the row (a worker's counted drop, or a sink that writes none)."""


class Walk:
    """One row's walk: ``convert`` a value (refs made), ``cell`` one inside a table."""

    def __init__(self, staging: Staging, make: Make) -> None:
        self.staging = staging
        self._make = make
        # One object per ref: shared mode logs a ref as {key}/rank{r} and, reduced, as {key};
        # wandb binds (moves) its file once and points both at it.
        self._made: dict[Any, Any] = {}

    def convert(self, value: Any) -> Any:
        kind = type(value)
        if kind is list:
            out = []
            for item in value:
                try:
                    out.append(self.convert(item))
                except Absent:
                    continue  # that element only (a rank's counted drop)
                except BadMediaError as exc:
                    self.staging.dropped += 1
                    self.staging.warn(f"a media value in a list left out of the run: {exc}")
            return out
        if kind is dict:
            return {k: self.convert(v) for k, v in value.items()}
        if kind is not MediaRef:
            return value
        desc = value.desc
        # A file named twice (one value logged under two keys: the rank staged it once) is
        # one object too: wandb moves the file with the first, and the second is bound.
        key = desc["f"] if type(desc.get("f")) is str else id(value)
        known = self._made.get(key)
        if known is not None:
            return known
        what = desc["k"]
        if what == "dropped":
            self.staging.dropped += 1
            self.staging.warn(f"a rank dropped a {desc.get('what')} it logged: {desc.get('why')}")
            raise Absent
        try:
            obj = self._make(what, desc, self)
        except (BadMediaError, Absent):
            raise
        except Exception as exc:  # the sink refusing what a descriptor says
            raise BadMediaError(f"{type(exc).__name__}: {exc}") from exc
        self.staging.logged += 1
        self._made[key] = obj
        return obj

    def cell(self, value: Any) -> Any:
        try:
            return self.convert(value)
        except Absent:
            return None  # a dropped image in a table: an empty cell, counted


# (descriptor kind, descriptor, the walk for what it holds) -> what the sink writes for it
Make = Callable[[str, dict[str, Any], Walk], Any]


def materialize(
    row: dict[str, Any], staging: Staging, make: Make
) -> tuple[dict[str, Any], set[str]]:
    """``row`` with every MediaRef made by ``make``, and the keys that hold media. A ref that
    cannot be made is left out (counted, and said once per reason); in a list, only that
    element."""
    out: dict[str, Any] = {}
    keys: set[str] = set()
    walk = Walk(staging, make)
    for key, value in row.items():
        if type(value) not in CONTAINERS:
            out[key] = value
            continue
        keys.add(key)
        try:
            out[key] = walk.convert(value)
        except BadMediaError as exc:
            staging.dropped += 1
            staging.warn(f"media at key {key!r} left out of the run: {exc}")
        except Absent:
            continue
    return out, keys
