"""Process lifecycle: exit hooks, the SIGTERM hook, exit codes, and whether a pid still lives.

One SIGTERM handler per process runs every registered shutdown callback (flush this process's
streams; close the funnel it owns) and then lets the signal do what it did before: a process
that would have died of SIGTERM still dies of it, and a user's own handler still runs. The
library never swallows a signal.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing.util
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import CodeType, FrameType
from typing import Any

from . import _signal_watch
from ._config import EXIT_EXCEPTION, EXIT_OK, EXIT_SIGINT, EXIT_SIGTERM

ShutdownCallback = Callable[[int, str], None]  # (exit_code, reason)

_callbacks: list[tuple[int, ShutdownCallback]] = []  # (priority, callback); low runs first
_exit_hook_pid = -1
_previous_sigterm: Any = None
sigterm_runs = 0  # times our SIGTERM hook ran (the signal watcher stops nudging once it has)


def _reset_in_child() -> None:
    # Callbacks registered by the parent belong to the parent's streams and funnel, and so
    # does a SIGTERM the parent had deferred.
    global _exit_hook_pid, sigterm_deferred
    _callbacks.clear()
    _exit_hook_pid = -1
    sigterm_deferred = False
    # A forked child that never logs should meet SIGTERM as it would without this library
    # (a Pool worker dies of it at once); attaching installs the hook again.
    try:
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:
            previous = _previous_sigterm
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
    except ValueError:
        pass  # forked from a thread CPython does not count as main


os.register_at_fork(after_in_child=_reset_in_child)


def add_shutdown_callback(callback: ShutdownCallback, priority: int) -> None:
    """Run ``callback(exit_code, reason)`` when this process exits or dies of SIGTERM."""
    if all(cb is not callback for _, cb in _callbacks):
        _callbacks.append((priority, callback))
        _callbacks.sort(key=lambda item: item[0])
    _install_exit_hooks()
    install_sigterm_hook()


def remove_shutdown_callback(callback: ShutdownCallback) -> None:
    _callbacks[:] = [(p, cb) for p, cb in _callbacks if cb is not callback]


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back while the block runs, then re-deliver them.

    A shutdown is bounded, and cut short it loses data: a Pool's terminate() often lands
    while its worker is already flushing on the way out, and a second Ctrl-C often lands
    during close(). Held signals still do what they would have done, just after the flush.
    Only the main thread can touch signal handlers; elsewhere this holds nothing.
    """
    deferred: list[int] = []
    saved: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():

        def hold(signum: int, frame: FrameType | None) -> None:
            if signum not in deferred:
                deferred.append(signum)

        for signum in (signal.SIGINT, signal.SIGTERM):
            current = signal.getsignal(signum)
            if current is None or current == signal.SIG_IGN:
                continue  # not installed from Python, or ignored: leave it alone
            saved[signum] = current
            signal.signal(signum, hold)
    try:
        yield
    finally:
        for held, handler in saved.items():
            signal.signal(held, handler)
        for pending in deferred:
            os.kill(os.getpid(), pending)


def run_shutdown_callbacks(exit_code: int, reason: str) -> None:
    """Run (and forget) every callback, with signals held; each runs once, and a failing one
    never stops the rest."""
    with signals_held():
        while _callbacks:
            _, callback = _callbacks.pop(0)
            try:
                callback(exit_code, reason)
            except Exception as exc:  # the logging side never fails the user's exit
                print(f"wandb-funnel: shutdown step failed: {exc!r}", file=sys.stderr)


def exit_code_from_exception(exc: BaseException | None) -> int:
    """The run's exit code for a block or interpreter that ended with ``exc``."""
    if exc is None:
        return EXIT_OK
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_SIGINT
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None:
            return EXIT_OK
        return code if isinstance(code, int) else EXIT_EXCEPTION
    return EXIT_EXCEPTION


_sys_exit_status: list[object] = []


def _hook_sys_exit() -> None:
    """Remember the status passed to sys.exit(), as wandb's own exit hooks do: at atexit time
    it is otherwise gone, and the run's exit code should match the process's."""
    original = sys.exit
    if getattr(original, "_wandb_funnel", False):
        return

    def exit(status: object = None) -> None:
        _sys_exit_status[:] = [status]
        original(status)  # type: ignore[arg-type]

    exit._wandb_funnel = True  # type: ignore[attr-defined]
    sys.exit = exit  # type: ignore[assignment]


def _at_interpreter_exit() -> None:
    if os.getpid() != _exit_hook_pid:
        return  # inherited through fork: the parent's exit, not ours
    # An uncaught exception leaves sys.last_value (3.11) / sys.last_exc (3.12+) behind.
    exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if exc is None and _sys_exit_status:
        exc = SystemExit(_sys_exit_status[0])
    run_shutdown_callbacks(exit_code_from_exception(exc), "interpreter exit")


def _install_exit_hooks() -> None:
    global _exit_hook_pid
    if _exit_hook_pid == os.getpid():
        return
    _exit_hook_pid = os.getpid()
    _hook_sys_exit()
    # multiprocessing.util (imported with this module) registered its atexit handler first,
    # so ours runs before it (last in, first out): the run is finished before it joins children.
    atexit.register(_at_interpreter_exit)
    # multiprocessing children leave through os._exit(), which skips atexit; their
    # finalizers with an exit priority still run on the way out.
    multiprocessing.util.Finalize(None, _at_interpreter_exit, exitpriority=100)
    # A forkserver child that logs while its Process object is unpickled (the target's module
    # logs at import) registers that finalizer before multiprocessing's bootstrap clears them
    # all; the bootstrap then runs the after-fork hooks, and this one puts ours back.
    multiprocessing.util.register_after_fork(_AFTER_BOOTSTRAP_KEY, _reinstall_finalizer)


class _Key:
    """Something multiprocessing's after-fork registry can hold a weak reference to."""


_AFTER_BOOTSTRAP_KEY = _Key()


def _reinstall_finalizer(_key: object) -> None:
    # Also called in a child forked from this process: not ours (its own hooks install on
    # its first use).
    if _exit_hook_pid == os.getpid():
        multiprocessing.util.Finalize(None, _at_interpreter_exit, exitpriority=100)


def install_sigterm_hook() -> None:
    """Hook SIGTERM in this process, once; only possible from the main thread."""
    global _previous_sigterm
    if threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signal.SIGTERM)
    if current == signal.SIG_IGN:
        return  # the process chose to survive SIGTERM: nothing to do on it
    if current is not _on_sigterm:
        _previous_sigterm = current
        signal.signal(signal.SIGTERM, _on_sigterm)
    _signal_watch.arm(lambda: sigterm_runs)  # the handler runs even if SIGTERM lands badly


# Code that our SIGTERM hook must not interrupt: found on the interrupted stack, so no counter
# can be left stale by an exception (a Ctrl-C can be raised at the entry of any function).
_deferring_codes: set[CodeType] = set()
sigterm_deferred = False  # a SIGTERM is waiting for the main thread to leave such code


def defer_sigterm_inside(code: CodeType) -> None:
    """Our SIGTERM hook waits while the main thread runs ``code`` (which must then call
    ``deliver_deferred_sigterm`` when ``sigterm_deferred`` is set, on its way out)."""
    _deferring_codes.add(code)


def _inside_deferring_code(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code in _deferring_codes:
            return True
        frame = frame.f_back
    return False


def deliver_deferred_sigterm() -> None:
    """Run the hook for a SIGTERM deferred on this (main) thread: once, and directly (a new
    signal would run a user's handler that chains to ours a second time)."""
    global sigterm_deferred
    if sigterm_deferred and threading.current_thread() is threading.main_thread():
        sigterm_deferred = False
        _on_sigterm(signal.SIGTERM, None)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    global sigterm_deferred, sigterm_runs
    if _deferring_codes and _inside_deferring_code(frame):
        sigterm_deferred = True  # the main thread is inside a batch send: after it
        return
    sigterm_runs += 1
    previous = _previous_sigterm
    if callable(previous):
        # The user's handler decides whether the process ends; we only make sure nothing
        # buffered is lost if it does.
        _flush_only()
        previous(signum, frame)
        return
    run_shutdown_callbacks(EXIT_SIGTERM, "SIGTERM")
    signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
    os.kill(os.getpid(), signal.SIGTERM)


_flush_callbacks: list[Callable[[], None]] = []


def add_flush_callback(callback: Callable[[], None]) -> None:
    """Run ``callback()`` (non-destructive) before a user's own SIGTERM handler."""
    if callback not in _flush_callbacks:
        _flush_callbacks.append(callback)


def _flush_only() -> None:
    for callback in list(_flush_callbacks):
        try:
            callback()
        except Exception as exc:
            print(f"wandb-funnel: flush on SIGTERM failed: {exc!r}", file=sys.stderr)


def _stat_fields(pid: int) -> list[bytes] | None:
    """Fields 3.. of /proc/<pid>/stat (state first), or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # Field 2 (comm) may contain spaces and parentheses: split after its closing paren.
    return stat[stat.rfind(b")") + 2 :].split()


def pid_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), to detect pid reuse."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields else None  # field 22 overall: starttime
    except (IndexError, ValueError):
        return None


def pid_alive(pid: int, start_time: int | None = None) -> bool:
    """True while ``pid`` runs (a zombie counts as dead; a reused pid does not count)."""
    fields = _stat_fields(pid)
    if fields is None:
        if os.path.isdir("/proc/self"):
            return False
        try:  # no procfs: the portable, weaker check
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    if not fields or fields[0] in (b"Z", b"X"):
        return False
    return start_time is None or pid_start_time(pid) in (None, start_time)
