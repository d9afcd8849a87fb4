"""The logger's half of media: descriptors back into wandb's own objects, staged files cleaned.

A worker sends a media value as a descriptor (``_worker/media.py``); the receiver decodes it to
a ``MediaRef``. Here, just before a row is logged, each ref becomes the wandb object plain
wandb would have logged (``wandb.Image``, ``wandb.Table``, ``wandb.Histogram``, a custom
chart ...), its file the staged one, marked temporary so that wandb *moves* it into the run's
``media/`` folder. After the row, whatever is still staged for it (a value a reducer left out,
a row wandb refused) is removed. Nothing here trusts a descriptor: only wandb's media classes
named below are made, files are plain names inside the staging directory, and a bad
descriptor costs its key, counted, never the row.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from typing import Any

from wandb_funnel._logger.receiver import log_to_stderr
from wandb_funnel._protocol.messages import MediaRef

# Descriptor class name -> where wandb keeps the class (attribute paths on the wandb module).
_FILE_CLASSES = {
    "Image": "Image",
    "Html": "Html",
    "Video": "Video",
    "Audio": "Audio",
    "Object3D": "Object3D",
    "Molecule": "Molecule",
    "Classes": "Classes",
    "ImageMask": "data_types.ImageMask",
    "BoundingBoxes2D": "data_types.BoundingBoxes2D",
}
# What wandb's constructors set that a descriptor's state may not carry.
_BASE_STATE = {
    "_run": None,
    "_artifact_source": None,
    "_artifact_target": None,
    "_caption": None,
    "_path": None,
    "_is_tmp": False,
    "_extension": None,
    "_sha256": None,
    "_size": None,
}
# The state a descriptor may set, per class, on top of the above (what wandb 0.31's
# constructors leave): anything else is refused, so a descriptor cannot steer where wandb
# writes (``_extension``, ``_path``, ``_is_tmp`` are the logger's own to set).
_STATE_KEYS = {
    "Image": {
        "_caption",
        "_grouping",
        "_width",
        "_height",
        "_classes",
        "_boxes",
        "_masks",
        "_file_type",
        "format",
        "_sha256",
        "_size",
    },
    "Html": {"_caption", "html", "_sha256", "_size"},
    "Video": {"_caption", "_width", "_height", "_channels", "_format", "_fps", "_sha256", "_size"},
    "Audio": {"_caption", "_duration", "_sample_rate", "_sha256", "_size"},
    "Object3D": {"_caption", "_sha256", "_size"},
    "Molecule": {"_caption", "_sha256", "_size"},
    "Classes": {"_caption", "_class_set"},
    "ImageMask": {"_caption", "_val", "_key", "_sha256", "_size"},
    "BoundingBoxes2D": {"_caption", "_val", "_key", "_class_labels", "_sha256", "_size"},
}
_HEX64 = re.compile(r"[0-9a-f]{64}")
# The run directory's files that wandb writes itself: a saved file never replaces one.
_WANDBS_OWN = re.compile(
    r"wandb-[^/]*|config\.yaml|output.*\.log|requirements\.txt|"
    r"diff\.patch|code/.*|media/.*|artifact/.*"
)
_PLAIN = re.compile(r"[\w.-]{1,128}")  # a name wandb puts into a file name
_FORMAT = re.compile(r"[A-Za-z0-9]{1,10}")
# Staged names: ``{pid}-{seq}-{8 hex}{extension}`` (``.png``, ``.mask.png``, ``.boxes2D.json``).
_STAGED = re.compile(r"[0-9]+-[0-9]+-[0-9a-f]{8}((?:\.[\w-]{1,32}){0,3})")


class BadMediaError(ValueError):
    """A descriptor this logger cannot turn into a wandb object."""


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


_CONTAINERS = (MediaRef, dict, list)
_CONTAINER_TYPES = frozenset(_CONTAINERS)


class MediaFiles:
    """One writer's media: makes wandb objects from refs, removes staged files after a row."""

    def __init__(self, directory: str | None, warn: Callable[[str], None] = log_to_stderr) -> None:
        self.directory = directory
        self.logged = 0  # media values handed to wandb
        self.dropped = 0  # media values that did not reach the run (workers' drops included)
        self.files = 0  # files of log_artifact and save that reached the run
        self.dropped_files = 0
        self._warn = warn  # the writer's: each message once

    def materialize(self, row: dict[str, Any], wandb: Any) -> tuple[dict[str, Any], set[str]]:
        """``row`` with every MediaRef made a wandb object, and the keys that hold media. A
        ref that cannot be made is left out (counted, and said once per reason); in a list,
        only that element. ``wandb`` None (the null sink): refs are counted as logged and
        left out."""
        out: dict[str, Any] = {}
        keys: set[str] = set()
        # One wandb object per ref: shared mode logs a ref as {key}/rank{r} and, reduced, as
        # {key}; wandb binds (moves) its file once and points both at it.
        made: dict[Any, Any] = {}
        for key, value in row.items():
            if type(value) not in _CONTAINERS:
                out[key] = value
                continue
            keys.add(key)
            try:
                out[key] = self._convert(value, wandb, made)
            except BadMediaError as exc:
                self.dropped += 1
                self._warn(f"media at key {key!r} left out of the run: {exc}")
            except _Absent:
                continue
        return out, keys

    def _convert(self, value: Any, wandb: Any, made: dict[Any, Any]) -> Any:
        kind = type(value)
        if kind is list:
            out = []
            for item in value:
                try:
                    out.append(self._convert(item, wandb, made))
                except _Absent:
                    continue  # that element only (a rank's counted drop)
                except BadMediaError as exc:
                    self.dropped += 1
                    self._warn(f"a media value in a list left out of the run: {exc}")
            return out
        if kind is dict:
            return {k: self._convert(v, wandb, made) for k, v in value.items()}
        if kind is not MediaRef:
            return value
        desc = value.desc
        # A file named twice (one value logged under two keys: the rank staged it once) is
        # one object too: wandb moves the file with the first, and the second is bound.
        key = desc["f"] if type(desc.get("f")) is str else id(value)
        known = made.get(key)
        if known is not None:
            return known
        what = desc["k"]
        if what == "dropped":
            self.dropped += 1
            self._warn(f"a rank dropped a {desc.get('what')} it logged: {desc.get('why')}")
            raise _Absent
        if wandb is None:
            self.logged += 1
            raise _Absent
        try:
            obj = self._make(what, desc, wandb, made)
        except BadMediaError:
            raise
        except Exception as exc:  # wandb refusing what a descriptor says
            raise BadMediaError(f"{type(exc).__name__}: {exc}") from exc
        self.logged += 1
        made[key] = obj
        return obj

    def _make(self, what: str, desc: dict[str, Any], wandb: Any, made: dict[Any, Any]) -> Any:
        if what == "histogram":
            return wandb.Histogram(np_histogram=(list(desc["histogram"]), list(desc["bins"])))
        if what == "table":
            return self._table(desc, wandb, made)
        if what == "chart":
            from_module = wandb.plot.custom_chart
            spec = from_module.CustomChartSpec(**desc["spec"])
            return from_module.CustomChart(table=self._table(desc["table"], wandb, made), spec=spec)
        if what == "file":
            return self._file_media(desc, wandb, made)
        raise BadMediaError(f"unknown media kind {what!r:.40}")

    def _table(self, desc: dict[str, Any], wandb: Any, made: dict[Any, Any]) -> Any:
        data = [[self._cell(c, wandb, made) for c in row] for row in desc["data"]]
        columns = list(desc["columns"])
        log_mode = desc.get("log_mode") or "IMMUTABLE"
        try:
            return wandb.Table(
                columns=columns,
                data=data,
                allow_mixed_types=bool(desc.get("mixed")),
                log_mode=log_mode,
            )
        except TypeError:  # a column of mixed types: the rank's table allowed them
            return wandb.Table(
                columns=columns, data=data, allow_mixed_types=True, log_mode=log_mode
            )

    def _cell(self, value: Any, wandb: Any, made: dict[Any, Any]) -> Any:
        try:
            return self._convert(value, wandb, made)
        except _Absent:
            return None  # a dropped image in a table: an empty cell, counted

    def _file_media(self, desc: dict[str, Any], wandb: Any, made: dict[Any, Any]) -> Any:
        name = desc.get("c")
        where = _FILE_CLASSES.get(name) if isinstance(name, str) else None
        if where is None or not isinstance(name, str):
            raise BadMediaError(f"not a wandb media class: {name!r:.40}")
        cls: Any = wandb
        for part in where.split("."):
            cls = getattr(cls, part)
        state = desc.get("s")
        if type(state) is not dict:
            raise BadMediaError("media state is not a map")
        obj = cls.__new__(cls)
        obj.__dict__.update(_BASE_STATE)
        if name == "Image":
            obj.__dict__.update(
                _image=None,
                _grouping=None,
                _width=None,
                _height=None,
                _classes=None,
                _boxes=None,
                _masks=None,
                _file_type=None,
                format=None,
            )
        allowed = _STATE_KEYS[name]
        for attr, item in state.items():
            if attr in allowed:
                obj.__dict__[attr] = self._state_value(attr, item, wandb, made)
        # The logger's own, whatever the state said: the file is the staged one (wandb
        # moves it into the run), named after the staged name's extension.
        obj._path = self._source(desc)
        obj._is_tmp = "f" in desc
        if "f" in desc:
            obj._extension = _STAGED.fullmatch(desc["f"]).group(1) or None  # type: ignore[union-attr]
        elif obj._path is not None:
            obj._sha256 = obj._sha256 if _is_hex64(obj._sha256) else None
        if obj._path is not None and "f" in desc and not _is_hex64(obj._sha256):
            raise BadMediaError("a staged media file needs its sha256")
        return obj

    def _state_value(self, attr: str, item: Any, wandb: Any, made: dict[Any, Any]) -> Any:
        """One state value, checked where wandb builds a file name from it."""
        if attr == "_sha256":
            if not _is_hex64(item):
                raise BadMediaError("sha256 must be 64 hex digits")
        elif attr == "_size":
            if type(item) is not int or item < 0:
                raise BadMediaError("size must be a count")
        elif attr in ("format", "_format"):
            if item is not None and not (type(item) is str and _FORMAT.fullmatch(item)):
                raise BadMediaError(f"bad media format {item!r:.40}")
        elif attr == "_key":
            if not (type(item) is str and _PLAIN.fullmatch(item)):
                raise BadMediaError(f"bad mask or box key {item!r:.60}")
        elif (
            attr in ("_boxes", "_masks")
            and item is not None
            and (
                type(item) is not dict
                or not all(type(k) is str and _PLAIN.fullmatch(k) for k in item)
            )
        ):
            raise BadMediaError(f"{attr} keys must be plain names")
        return self._convert(item, wandb, made)

    def _source(self, desc: dict[str, Any]) -> str | None:
        if "f" in desc:
            return self.path_of(desc["f"])
        ref = desc.get("ref")
        if ref is None:
            return None
        if type(ref) is not str or "://" not in ref or ref.startswith("file:"):
            raise BadMediaError(f"a media reference must be a URL, got {ref!r:.80}")
        return ref

    def path_of(self, name: Any) -> str:
        """The staged file ``name``, checked: a staged name in the staging directory."""
        if self.directory is None:
            raise BadMediaError("this logger has no staging directory")
        if type(name) is not str or not _STAGED.fullmatch(name):
            raise BadMediaError(f"a staged file must be a plain name, got {name!r:.80}")
        path = os.path.join(self.directory, name)
        if not os.path.isfile(path):
            raise BadMediaError(f"the staged file {name!r} is missing")
        return path

    def log_files(self, data: dict[str, Any], sink: Any) -> None:
        """A rank's ``log_artifact`` or ``save``: the staged files go into an artifact of the
        run, or into the run's directory; removed from staging whatever happens."""
        entries = data.get("entries")
        entries = entries if type(entries) is list else []
        names = [e[1] for e in entries if type(e) is list and len(e) == 2]
        wandb, run = getattr(sink, "wandb", None), getattr(sink, "run", None)
        try:
            if wandb is None or run is None:
                raise BadMediaError("no wandb run here (the null sink)")
            if data.get("op") == "refused":
                raise BadMediaError(f"{data.get('what')}: {data.get('why')}")
            if data.get("op") == "artifact":
                self._log_artifact(data, entries, wandb, run)
            elif data.get("op") == "save":
                self._save(data, entries, run)
            else:
                raise BadMediaError(f"unknown files operation {data.get('op')!r:.40}")
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

    def _log_artifact(self, data: dict[str, Any], entries: list[Any], wandb: Any, run: Any) -> None:
        artifact = wandb.Artifact(
            str(data["name"]),
            str(data.get("type") or "unspecified"),
            description=data.get("description"),
            metadata=data.get("metadata") or None,
        )
        for entry, name in entries:
            artifact.add_file(self.path_of(name), name=str(entry))  # a copy: staging may go
        for entry, uri in data.get("refs") or []:
            artifact.add_reference(str(uri), name=str(entry))
        run.log_artifact(
            artifact, aliases=data.get("aliases") or None, tags=data.get("tags") or None
        )

    def _save(self, data: dict[str, Any], entries: list[Any], run: Any) -> None:
        root = os.path.realpath(run.dir)
        for entry, name in entries:
            dest = os.path.realpath(os.path.join(root, str(entry)))
            if not dest.startswith(root + os.sep) or _WANDBS_OWN.fullmatch(
                os.path.relpath(dest, root)
            ):
                raise BadMediaError(
                    f"a saved file must stay inside the run, and off wandb's "
                    f"own files, got {entry!r:.80}"
                )
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.move(self.path_of(name), dest)  # the run may be on another filesystem
            run.save(dest, base_path=root, policy=data.get("policy") or "now")

    def discard(self, parts: Any) -> None:
        """Remove what is still staged for a row's records (wandb moved what it logged)."""
        if self.directory is None:
            return
        names: list[str] = []
        for data in parts:
            for value in data.values():
                if type(value) in _CONTAINERS:
                    names.extend(MediaRef({"k": "", "v": value}).files())
        for name in names:
            if type(name) is str and name and os.path.basename(name) == name:
                try:
                    os.unlink(os.path.join(self.directory, name))
                except OSError:
                    pass


def _is_hex64(value: Any) -> bool:
    return type(value) is str and _HEX64.fullmatch(value) is not None


class _Absent(Exception):  # noqa: N818  (control flow: a value that is not logged)
    """A ref that stays out of the row (a worker's counted drop, or no wandb)."""
