"""A worker's reading of wandb's own media objects: which they are, and their state as a
descriptor (``_worker/media.py`` sends it; ``sinks.wandb.media`` makes the object again in
the logger). Reads the objects' attributes, never imports wandb: a rank that only uses the
funnel's light media types never loads it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

# wandb's file-backed media, carried by their state. Their module must be wandb's own.
FILE_MEDIA = frozenset(
    {
        "Image",
        "Html",
        "Video",
        "Audio",
        "Object3D",
        "Molecule",
        "ImageMask",
        "BoundingBoxes2D",
        "Classes",
    }
)
# State that stays behind: the run or artifact it is bound to, a decoded PIL image, and the
# mask array (its PNG is the file that travels).
_LOCAL_STATE = frozenset({"_run", "_artifact_source", "_artifact_target", "_image", "_path"})


def wandb_class(value: Any) -> str | None:
    """The class name of one of wandb's media objects, else None (no wandb import)."""
    kind = type(value)
    if not kind.__module__.startswith("wandb."):
        return None
    name = kind.__name__
    if name in FILE_MEDIA or name in ("Histogram", "Table", "CustomChart"):
        return name
    return None


def describe(
    value: Any,
    name: str,
    stage_file: Callable[[str, str, bool], str],
    table: Callable[[list[Any], list[Any], bool, str | None], dict[str, Any]],
) -> dict[str, Any]:
    """The descriptor of wandb's media object ``value`` (``name``: ``wandb_class(value)``):
    its state as wandb's constructor left it, its file staged by ``stage_file(path,
    extension, link)`` (which returns the staged name); a table's by ``table(columns, data,
    mixed, log_mode)``."""
    if name == "Histogram":
        return {"k": "histogram", "histogram": list(value.histogram), "bins": list(value.bins)}
    if name == "Table":
        mixed = "Union" in type(getattr(value, "_column_types", None)).__name__
        return table(value.columns, value.data, mixed, getattr(value, "log_mode", None))
    if name == "CustomChart":
        chart_table = value.table
        spec = value.spec
        return {
            "k": "chart",
            "table": table(chart_table.columns, chart_table.data, False, None),
            "spec": {
                "spec_name": spec.spec_name,
                "fields": dict(spec.fields),
                "string_fields": dict(spec.string_fields or {}),
                "key": spec.key,
                "panel_type": spec.panel_type,
                "split_table": spec.split_table,
            },
        }
    state: dict[str, Any] = {}
    for attr, item in vars(value).items():
        if attr in _LOCAL_STATE:
            continue
        if attr == "_val" and isinstance(item, dict) and "mask_data" in item:
            state[attr] = {k: v for k, v in item.items() if k != "mask_data"}
        else:
            state[attr] = item
    desc: dict[str, Any] = {"k": "file", "c": name, "s": state}
    path = getattr(value, "_path", None)
    if isinstance(path, str):
        if os.path.isfile(path):
            extension = getattr(value, "_extension", None) or os.path.splitext(path)[1]
            # wandb's own temporary file (made from an array) is never written again: linked.
            # A user's file is copied now, as wandb copies it at log time.
            desc["f"] = stage_file(path, extension, bool(getattr(value, "_is_tmp", False)))
        elif "://" in path:
            desc["ref"] = path  # an image by reference (a URL): no file travels
        else:
            raise ValueError(f"wandb_funnel: the file of this {name} is gone: {path!r}")
    return desc
