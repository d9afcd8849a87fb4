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
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from wandb_funnel._logger.say import log_to_stderr
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


def count_media(data: Any, depth: int = 0) -> int:
    """The media values in ``data`` as a sink counts them when it writes them (``logged``):
    each MediaRef but a rank's counted drop, and those inside it (a table's image cells).
    For records a restarted logger skips because the dead logger wrote them after its last
    state: their media are the run's, and counted here."""
    kind = type(data)
    if depth > 32:
        return 0
    if kind is MediaRef:
        if data.desc.get("k") == "dropped":
            return 0
        return 1 + sum(count_media(v, depth + 1) for v in data.desc.values())
    if kind is dict:
        return sum(count_media(v, depth + 1) for v in data.values())
    if kind is list:
        return sum(count_media(v, depth + 1) for v in data)
    return 0


_KEPT = ".kept"  # a staged file's second name while its row is not yet saved


def _staged_names(parts: Any) -> list[str]:
    """The staged file names a row's parts refer to."""
    names: list[str] = []
    for data in parts:
        for value in data.values():
            if type(value) in CONTAINERS:
                names.extend(MediaRef({"k": "", "v": value}).files())
    return names


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
        # A second name (a hard link: no copy) for each staged file of a row written and not
        # yet saved, with the row's index: wandb moves the file into the run, and a logger
        # restarted after this one died finds the file again when the row's record is resent.
        self._kept: deque[tuple[int, list[str]]] = deque()

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
            try:  # resent after a restart: the dead logger kept it under its second name
                os.rename(path + _KEPT, path)
            except OSError:
                raise BadMediaError(f"the staged file {name!r} is missing") from None
        return path

    def keep(self, parts: Any, row: int) -> None:
        """Keep the staged files of row number ``row`` under a second name until the row is
        saved (``release``): the row's records are resent if this logger dies first."""
        if self.directory is None:
            return
        kept: list[str] = []
        for name in _staged_names(parts):
            if type(name) is not str or not STAGED.fullmatch(name):
                continue  # not a staged name: the sink refuses it anyway
            path = os.path.join(self.directory, name)
            try:
                os.link(path, path + _KEPT)
                kept.append(path + _KEPT)
            except OSError:
                pass  # not staged (yet), kept already, or a filesystem without links
        if kept:
            self._kept.append((row, kept))

    def release(self, saved_rows: int) -> None:
        """Rows before ``saved_rows`` are in the run's transaction log: their files may go."""
        kept = self._kept
        while kept and kept[0][0] < saved_rows:
            for path in kept.popleft()[1]:
                try:
                    os.unlink(path)
                except OSError:
                    pass

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
        for name in _staged_names(parts):
            if type(name) is str and name and os.path.basename(name) == name:
                try:
                    os.unlink(os.path.join(self.directory, name))
                except OSError:
                    pass
