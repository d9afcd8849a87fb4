"""How the logger process leaves: ``os._exit``, once its own temporary directories are gone.

The logger leaves through ``os._exit`` on every path (a run's code, a restart, a close that
ran out of time): nothing the wandb SDK left running may hold the exit. That skips the
interpreter's exit hooks, and with them the finalizers of ``tempfile.TemporaryDirectory``:
wandb makes two at import (``tmp*wandb-media``, ``tmp*wandb-artifacts``), so each logger left
two empty directories in the user's TMPDIR, where a plain wandb script leaves none. They are
removed here, as a normal exit would have.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
import weakref
from typing import NoReturn


def remove_temp_dirs() -> int:
    """Remove every ``TemporaryDirectory`` of this process still alive (its finalizer, run
    now); returns how many. Never raises."""
    cleanup = getattr(getattr(tempfile.TemporaryDirectory, "_cleanup", None), "__func__", None)
    registry = getattr(weakref.finalize, "_registry", {})  # CPython's, since 3.4
    removed = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # "implicitly cleaning up"
        for finalizer, info in list(registry.items()):
            if cleanup is not None and getattr(info.func, "__func__", None) is cleanup:
                try:
                    finalizer()
                    removed += 1
                except Exception:
                    pass  # a directory that will not go is left, as before
    return removed


def leave(code: int) -> NoReturn:
    """Flush the terminal, remove this process's temporary directories, and exit with
    ``code`` (a byte: a run's code may be any int)."""
    remove_temp_dirs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if 0 <= code <= 255 else 1)
