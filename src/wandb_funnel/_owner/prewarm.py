"""A logger started ahead of time, so that ``wandb.init`` does not wait for it to start.

A new logger process spends about 0.6 s before it can open a run: Python, its modules and
``import wandb``. Started when an installed process imports wandb (a script's ``import
wandb``, long before its ``wandb.init``), it does that beside the script's own imports, and
waits for its start message; ``Funnel.start`` then takes it instead of starting one (issue
34: a 3-log script took 1.3 s longer than plain wandb's).

Only where it can pay and costs no one else: a top-level process (not a multiprocessing
child: those attach to their parent's funnel or make a plain run) that is not a launched rank
(which rank hosts is decided at ``wandb.init``), with no funnel to attach to, the wandb sink,
and ``WANDB_FUNNEL_PREWARM`` not "0". Never used, it is killed and reaped at exit (it has done
nothing but import); a forked child closes its copy of the pipe (the logger belongs to the
process that started it); an owner that dies leaves it an end-of-file, and it exits.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import subprocess
import sys
from typing import NamedTuple

from wandb_funnel._constants import ENV_ADDRESS, ENV_PREWARM, ENV_SINK


class Warm(NamedTuple):
    proc: subprocess.Popen[bytes]
    ready_r: int  # the pipe the logger says "ready" on: read end (ours)
    ready_w: int  # and write end (the logger's, the same number there)
    owner_pid: int


_warm: Warm | None = None


def wanted() -> bool:
    """Whether a logger started now could be this process's: see the module's docstring."""
    from wandb_funnel._launcher_env import detect

    env = os.environ
    return (
        env.get(ENV_PREWARM, "1") != "0"
        and not env.get(ENV_SINK)
        and env.get("WANDB_MODE") != "disabled"
        and ENV_ADDRESS not in env
        and not _a_multiprocessing_child()
        and detect() is None
    )


def _a_multiprocessing_child() -> bool:
    """A child of multiprocessing, also while a spawn child still imports its parent's main
    module (``parent_process()`` is set only after that), and the forkserver: each is started
    as ``python -c`` (a one-liner of the user's is skipped too: it is no script to wait for)."""
    return (
        multiprocessing.parent_process() is not None
        or bool(getattr(multiprocessing.current_process(), "_inheriting", False))
        or sys.argv[:1] == ["-c"]
    )


def start() -> None:
    """Start this process's logger ahead of time, once, where ``wanted()``."""
    global _warm
    if _warm is not None or not wanted():
        return
    from wandb_funnel._owner.logger_process import LoggerProcess

    ready_r, ready_w = os.pipe()
    try:
        proc = LoggerProcess.popen(ready_w, warm=True)
    except OSError:
        os.close(ready_r)
        os.close(ready_w)
        return  # no logger ahead of time: wandb.init starts one as always
    _warm = Warm(proc, ready_r, ready_w, os.getpid())
    atexit.register(discard)


def take() -> Warm | None:
    """This process's logger started ahead of time, if it is still waiting (it is ours now:
    the caller writes its start message and closes the pipes)."""
    global _warm
    warm = _warm
    _warm = None
    if warm is None:
        return None
    if warm.owner_pid != os.getpid() or warm.proc.poll() is not None:
        _close(warm, reap=warm.owner_pid == os.getpid())
        return None
    return warm


def discard() -> None:
    """At exit: a logger started ahead of time and never used is killed (it has only
    imported) and reaped."""
    global _warm
    warm, _warm = _warm, None
    if warm is not None and warm.owner_pid == os.getpid():
        _close(warm, reap=True)


def _close(warm: Warm, reap: bool) -> None:
    for fd in (warm.ready_r, warm.ready_w):
        try:
            os.close(fd)
        except OSError:
            pass
    if warm.proc.stdin is not None:
        try:
            warm.proc.stdin.close()
        except OSError:
            pass
    if reap:
        if warm.proc.poll() is None:
            warm.proc.kill()
        warm.proc.wait()


def _forget_in_child() -> None:
    """A forked child: the logger is its parent's. Its copy of the pipes goes, so that the
    parent's end of file reaches the logger."""
    global _warm
    warm, _warm = _warm, None
    if warm is not None:
        _close(warm, reap=False)


os.register_at_fork(after_in_child=_forget_in_child)
