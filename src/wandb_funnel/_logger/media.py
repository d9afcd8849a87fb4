"""The logger's half of media: the staging directory, its cleanup, and the accounting.

A worker stages a media value's file in the funnel's staging directory and sends a descriptor
(``_worker/media.py``); the receiver decodes it to a ``MediaRef``. The sink makes of each ref
what it writes (``sinks.refs``; wandb's objects in ``sinks.wandb.media``), through the
``Staging`` this module implements: staged names checked, media counted. After the row,
whatever is still staged for it (a value a reducer left out, a row wandb refused) is removed;
after a files update, its staged files are.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from wandb_funnel._logger.receiver import log_to_stderr
from wandb_funnel._protocol.messages import MediaRef
from wandb_funnel.sinks.refs import CONTAINERS, STAGED, BadMediaError

if TYPE_CHECKING:
    from wandb_funnel.sinks import Sink


def has_media(data: Any, depth: int = 0) -> bool:
    """Whether ``data`` (a record's dict, or a value in it) holds a MediaRef. Every row's
    parts come through here: a part of plain numbers costs one set check, done in C."""
    kind = type(data)
    if kind is MediaRef:
        return True
    if depth > 32:
        return False
    if kind is dict:
        values = data.values()
    elif kind is list:
        values = data
    else:
        return False
    if _CONTAINER_TYPES.isdisjoint(map(type, values)):
        return False
    return any(type(v) in _CONTAINER_TYPES and has_media(v, depth + 1) for v in values)


_CONTAINER_TYPES = frozenset(CONTAINERS)


class MediaFiles:
    """One writer's staged media (a ``sinks.Staging``): checks staged names, counts what the
    sink logged or dropped, removes staged files after a row or a files update."""

    def __init__(self, directory: str | None, warn: Callable[[str], None] = log_to_stderr) -> None:
        self.directory = directory
        self.logged = 0  # media values handed to the run
        self.dropped = 0  # media values that did not reach the run (workers' drops included)
        self.files = 0  # files of log_artifact and save that reached the run
        self.dropped_files = 0
        self._warn = warn  # the writer's: each message once

    def warn(self, message: str) -> None:
        self._warn(message)

    def path_of(self, name: Any) -> str:
        """The staged file ``name``, checked: a staged name in the staging directory."""
        if self.directory is None:
            raise BadMediaError("this logger has no staging directory")
        if type(name) is not str or not STAGED.fullmatch(name):
            raise BadMediaError(f"a staged file must be a plain name, got {name!r:.80}")
        path = os.path.join(self.directory, name)
        if not os.path.isfile(path):
            raise BadMediaError(f"the staged file {name!r} is missing")
        return path

    def log_files(self, data: dict[str, Any], sink: Sink | None) -> None:
        """A rank's ``log_artifact`` or ``save``: the sink takes the staged files (into an
        artifact of the run, or into the run's directory); counted, and removed from staging
        whatever happens."""
        entries = data.get("entries")
        entries = entries if type(entries) is list else []
        names = [e[1] for e in entries if type(e) is list and len(e) == 2]
        try:
            if sink is None:
                raise BadMediaError("the run could not be opened")
            if data.get("op") == "refused":
                raise BadMediaError(f"{data.get('what')}: {data.get('why')}")
            sink.files(data, self)
            self.files += len(names)
        except Exception as exc:
            self.dropped_files += len(names) or 1
            self._warn(f"{data.get('op')} from a rank left out of the run: {exc!r:.300}")
        finally:
            for name in names:
                try:
                    os.unlink(self.path_of(name))
                except (OSError, BadMediaError):
                    pass  # moved into the run (save), or never there

    def discard(self, parts: Any) -> None:
        """Remove what is still staged for a row's records (wandb moved what it logged)."""
        if self.directory is None:
            return
        names: list[str] = []
        for data in parts:
            for value in data.values():
                if type(value) in CONTAINERS:
                    names.extend(MediaRef({"k": "", "v": value}).files())
        for name in names:
            if type(name) is str and name and os.path.basename(name) == name:
                try:
                    os.unlink(os.path.join(self.directory, name))
                except OSError:
                    pass
