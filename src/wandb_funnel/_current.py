"""This process's current Run: what ``wf.log`` logs to and ``wf.finish`` finishes.

A bottom module (it imports nothing of ours but ``_pid``), so that the module API and the
owner's Funnel can both set it without importing each other. A Run inherited through fork is
never current in the child: the registry resets at fork, and a Run is also checked against
the pid that made it current.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from wandb_funnel import _pid

if TYPE_CHECKING:
    from wandb_funnel._worker.run import Run

lock = threading.RLock()  # held across "is there a current run? if not, make one"
_current: Run | None = None
_current_pid = -1


def _reset_in_child() -> None:
    global _current, _current_pid, lock
    _current, _current_pid = None, -1
    lock = threading.RLock()  # a fork while another thread held it must not deadlock here


os.register_at_fork(after_in_child=_reset_in_child)


def get() -> Run | None:
    """This process's current, unfinished Run."""
    run = _current
    if run is None or _current_pid != _pid.current or run.finished:
        return None
    return run


def use(run: Run) -> None:
    """Make ``run`` this process's current Run."""
    global _current, _current_pid
    _current, _current_pid = run, _pid.current


def adopt(run: Run) -> None:
    """Make ``run`` current unless this process already has one (a Funnel's rank-0 run)."""
    with lock:
        if get() is None:
            use(run)


def forget(run: Run | None) -> None:
    """``run`` is current no longer (finished, or its funnel closed)."""
    global _current
    with lock:
        if run is not None and _current is run:
            _current = None
