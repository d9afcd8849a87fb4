"""The wandb half of media: descriptors back into wandb's own objects, files into the run.

Just before a row is logged, each ref (``sinks.refs``) becomes the wandb object plain wandb
would have logged (``wandb.Image``, ``wandb.Table``, ``wandb.Histogram``, a custom chart
...), its file the staged one, marked temporary so that wandb *moves* it into the run's
``media/`` folder. ``log_artifact`` and ``save`` from a rank become the run's artifact or
files. Nothing here trusts a descriptor: only wandb's media classes named below are made,
files are plain names inside the staging directory (``Staging.path_of``), and a bad
descriptor costs its key, counted, never the row. The staging directory, its cleanup and the
accounting are the logger's (``_logger/media.py``).
"""

from __future__ import annotations

import os
import re
import shutil
from typing import TYPE_CHECKING, Any

from wandb_funnel.sinks.refs import STAGED, BadMediaError, Walk
from wandb_funnel.sinks.wandb import compat

if TYPE_CHECKING:
    from wandb_funnel.sinks import Staging

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
_WANDBS_OWN = re.compile(
    r"wandb-[^/]*|config\.yaml|output.*\.log|requirements\.txt|"
    r"diff\.patch|code/.*|media/.*|artifact/.*"
)
_PLAIN = re.compile(r"[\w.-]{1,128}")  # a name wandb puts into a file name
_FORMAT = re.compile(r"[A-Za-z0-9]{1,10}")
_HEX64 = re.compile(r"[0-9a-f]{64}")


class Maker:
    """Makes wandb objects from descriptors (a ``sinks.refs.Make``) with one wandb module."""

    def __init__(self, wandb: Any) -> None:
        self.wandb = wandb

    def __call__(self, what: str, desc: dict[str, Any], walk: Walk) -> Any:
        wandb = self.wandb
        if what == "histogram":
            return wandb.Histogram(np_histogram=(list(desc["histogram"]), list(desc["bins"])))
        if what == "table":
            return self._table(desc, walk)
        if what == "chart":
            from_module = wandb.plot.custom_chart
            spec = from_module.CustomChartSpec(**desc["spec"])
            return from_module.CustomChart(table=self._table(desc["table"], walk), spec=spec)
        if what == "file":
            return self._file_media(desc, walk)
        raise BadMediaError(f"unknown media kind {what!r:.40}")

    def _table(self, desc: dict[str, Any], walk: Walk) -> Any:
        data = [[walk.cell(c) for c in row] for row in desc["data"]]
        columns = list(desc["columns"])
        log_mode = desc.get("log_mode") or "IMMUTABLE"
        try:
            return self.wandb.Table(
                columns=columns,
                data=data,
                allow_mixed_types=bool(desc.get("mixed")),
                log_mode=log_mode,
            )
        except TypeError:  # a column of mixed types: the rank's table allowed them
            return self.wandb.Table(
                columns=columns, data=data, allow_mixed_types=True, log_mode=log_mode
            )

    def _file_media(self, desc: dict[str, Any], walk: Walk) -> Any:
        name = desc.get("c")
        where = _FILE_CLASSES.get(name) if isinstance(name, str) else None
        if where is None or not isinstance(name, str):
            raise BadMediaError(f"not a wandb media class: {name!r:.40}")
        cls: Any = self.wandb
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
                obj.__dict__[attr] = _state_value(attr, item, walk)
        # The logger's own, whatever the state said: the file is the staged one (wandb
        # moves it into the run), named after the staged name's extension.
        obj._path = _source(desc, walk.staging)
        obj._is_tmp = "f" in desc
        if "f" in desc:
            obj._extension = STAGED.fullmatch(desc["f"]).group(1) or None  # type: ignore[union-attr]
        elif obj._path is not None:
            obj._sha256 = obj._sha256 if _is_hex64(obj._sha256) else None
        if obj._path is not None and "f" in desc and not _is_hex64(obj._sha256):
            raise BadMediaError("a staged media file needs its sha256")
        return obj


def _state_value(attr: str, item: Any, walk: Walk) -> Any:
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
            type(item) is not dict or not all(type(k) is str and _PLAIN.fullmatch(k) for k in item)
        )
    ):
        raise BadMediaError(f"{attr} keys must be plain names")
    return walk.convert(item)


def _source(desc: dict[str, Any], staging: Staging) -> str | None:
    if "f" in desc:
        return staging.path_of(desc["f"])
    ref = desc.get("ref")
    if ref is None:
        return None
    if type(ref) is not str or "://" not in ref or ref.startswith("file:"):
        raise BadMediaError(f"a media reference must be a URL, got {ref!r:.80}")
    return ref


def _is_hex64(value: Any) -> bool:
    return type(value) is str and _HEX64.fullmatch(value) is not None


def log_files(data: dict[str, Any], staging: Staging, run: Any, wandb: Any) -> None:
    """A rank's ``log_artifact`` or ``save``: the staged files go into an artifact of the
    run, or into the run's directory (the caller counts and cleans up)."""
    entries = data.get("entries")
    entries = entries if type(entries) is list else []
    if data.get("op") == "artifact":
        _log_artifact(data, entries, staging, run, wandb)
    elif data.get("op") == "save":
        _save(data, entries, staging, run)
    else:
        raise BadMediaError(f"unknown files operation {data.get('op')!r:.40}")


def _log_artifact(
    data: dict[str, Any], entries: list[Any], staging: Staging, run: Any, wandb: Any
) -> None:
    artifact = wandb.Artifact(
        str(data["name"]),
        str(data.get("type") or "unspecified"),
        description=data.get("description"),
        metadata=data.get("metadata") or None,
    )
    for entry, name in entries:
        artifact.add_file(staging.path_of(name), name=str(entry))  # a copy: staging may go
    for entry, uri in data.get("refs") or []:
        artifact.add_reference(str(uri), name=str(entry))
    run.log_artifact(artifact, aliases=data.get("aliases") or None, tags=data.get("tags") or None)


def _save(data: dict[str, Any], entries: list[Any], staging: Staging, run: Any) -> None:
    """Each staged file moved to its name in the run's files directory, then the rank's glob
    (relative to that directory) saved there by wandb itself, as plain wandb saves it once
    its links are made: the same ``files`` record, the same names, and whatever else the
    glob matches in the run already (``_worker/files.py``)."""
    files_dir = str(run.dir)
    root = os.path.realpath(files_dir)
    pattern = data.get("glob")
    if pattern is not None and not _under_the_run(pattern):
        raise BadMediaError(f"a saved glob must stay inside the run, got {pattern!r:.80}")
    for entry, name in entries:
        dest = os.path.realpath(os.path.join(root, str(entry)))
        if not dest.startswith(root + os.sep) or _WANDBS_OWN.fullmatch(os.path.relpath(dest, root)):
            raise BadMediaError(
                f"a saved file must stay inside the run, and off wandb's "
                f"own files, got {entry!r:.80}"
            )
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.move(staging.path_of(name), dest)  # the run may be on another filesystem
    policy = data.get("policy") or "now"
    if pattern is None:  # an update without its glob: each file by its name
        for entry, _ in entries:
            path = os.path.join(files_dir, str(entry))
            compat.save(run, path, files_dir, policy, expand=False)
    else:
        path = os.path.join(files_dir, pattern)
        compat.save(run, path, files_dir, policy, expand=data.get("expand") is not False)


def _under_the_run(pattern: Any) -> bool:
    """A relative glob that cannot leave the directory it is joined to."""
    parts = pattern.split("/") if type(pattern) is str else []
    return bool(parts) and parts[0] != "" and ".." not in parts and "\x00" not in pattern
