"""The funnel's private directory: every file in it, named, read and written here.

The owner makes it (``0700``, its user only) when it starts a logger, and removes it when
the funnel has closed; a logger whose owner is gone removes it itself. What is in it:

- ``logger.sock``: the logger's socket (``ipc://``), which the ranks on this node connect to;
- ``media/``: files a rank staged for the logger (images, saved files) until they are in the run;
- ``run-info.json``: what the open run says about itself (name, dir, url), for processes on
  this node that have no stream of their own to ask with;
- ``status.json``: what ``wandb-funnel status`` shows, rewritten once a second;
- ``final-stats.json``: the accounting, when a close cut short inside wandb sends no DONE;
- ``logger-state.json``, ``logger-run-data.json``, ``logger-taken.bin``: what a logger
  leaves for the one that replaces it (``_logger/continuity.py`` says what each holds).

No import beyond the standard library's ``os`` and ``json``: a logger's watchdog writes and
removes here while its main thread may be stuck inside wandb, holding an import lock.
"""

from __future__ import annotations

import json
import os
from typing import Any, Final

SOCKET: Final = "logger.sock"
# A node logger's (issue 38): its directory is not the logger's (no staged media, no run info)
NODE_SOCKET: Final = "node.sock"
MEDIA: Final = "media"
RUN_INFO: Final = "run-info.json"
STATUS: Final = "status.json"
FINAL_STATS: Final = "final-stats.json"
STATE: Final = "logger-state.json"
RUN_DATA: Final = "logger-run-data.json"
TAKEN: Final = "logger-taken.bin"


def of_address(address: str) -> str | None:
    """The private directory of a logger's ``ipc://`` address (None for ``tcp://``, and for
    a node logger's: the logger is on another node)."""
    if not address.startswith("ipc://") or os.path.basename(address) == NODE_SOCKET:
        return None
    return os.path.dirname(address[len("ipc://") :])


def path(directory: str, name: str) -> str:
    return os.path.join(directory, name)


def write_json(directory: str | None, name: str, data: dict[str, Any]) -> None:
    """``data`` as ``name``, written whole or not at all (a reader never sees half a file);
    quietly nothing when the directory is gone (the job is ending)."""
    if not directory:
        return
    target = os.path.join(directory, name)
    try:
        with open(target + ".tmp", "w") as f:
            json.dump(data, f)
        os.replace(target + ".tmp", target)
    except (OSError, TypeError, ValueError):
        pass


def read_json(directory: str | None, name: str) -> dict[str, Any]:
    """``name``'s object, or ``{}`` when it is missing, torn or not an object."""
    if not directory:
        return {}
    try:
        with open(os.path.join(directory, name)) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def remove(directory: str | None) -> None:
    """Remove the directory: the socket file, and whatever is still staged in it."""
    if not directory:
        return
    try:
        for root, dirs, files in os.walk(directory, topdown=False):
            for name in files:
                try:
                    os.unlink(os.path.join(root, name))
                except OSError:
                    pass
            for name in dirs:
                try:
                    os.rmdir(os.path.join(root, name))
                except OSError:
                    pass
        os.rmdir(directory)
    except OSError:
        pass
