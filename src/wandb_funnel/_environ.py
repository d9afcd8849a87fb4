"""Variables a funnel sets in ``os.environ`` for the processes started from here while it is
open (how to reach it), put back as they were when it closes: the owner's (``Funnel``) and a
launched rank's that joined (``_launched_init``)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping


def set_for_children(values: Mapping[str, str], names: Iterable[str] = ()) -> dict[str, str | None]:
    """Set ``values``; returns what they, and the other ``names``, were before."""
    saved = {name: os.environ.get(name) for name in (*names, *values)}
    os.environ.update(values)
    return saved


def put_back(saved: Mapping[str, str | None]) -> None:
    """Each variable of ``saved`` as it was (unset where it was not set)."""
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
