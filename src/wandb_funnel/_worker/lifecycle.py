"""Process lifecycle: exit hooks, the SIGTERM hook, exit codes, and whether a pid still lives.

Signal ownership (the table in docs/guide/lifecycle.md says the same to users). The library
never swallows a signal and never displaces a handler it did not install:

- Our SIGTERM hook is installed **once per process**, when the process first attaches, and only
  over ``SIG_DFL`` or a Python handler; never over ``SIG_IGN``. A handler installed later (by
  the user, Lightning, torchelastic) stays the installed one: we never put ours back.
- Ours, when the signal itself calls it: a handler it replaced is chained (flush what is
  buffered, then call that handler once; it decides whether and how the process ends); over
  ``SIG_DFL`` it closes this process's streams and funnel (bounded) and then dies of SIGTERM.
- Ours, when another handler calls it (a handler that chains to what it replaced): it flushes
  and returns. That handler owns the decision; dying here would cut it short.
- While a shutdown runs (``finish()``, ``close()``, the exit hooks) SIGINT and SIGTERM are held
  and then delivered once each to whatever is installed by then: a Python handler is called
  directly (so it runs exactly once, and its ``sys.exit(code)`` propagates from the call that
  was closing), ``SIG_DFL`` kills, ``SIG_IGN`` ignores.
- At interpreter exit a ``SystemExit`` raised by such a handler cannot change the exit status
  (atexit swallows it); ``_keep_exit_code`` applies it once the other exit hooks have run.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from wandb_funnel._constants import EXIT_EXCEPTION, EXIT_OK, EXIT_SIGINT, EXIT_SIGTERM

# The exit status a signal's handler chose while our atexit hook ran: ("code", n) or
# ("signal", signum). Applied by _keep_exit_code, registered here, before multiprocessing.util
# is imported where possible, so that it runs after every hook registered later (LIFO).
_forced_exit: tuple[str, int] | None = None


def _keep_exit_code() -> None:
    forced = _forced_exit
    if forced is None or os.getpid() != _exit_hook_pid:
        return
    # Still ahead of us in the atexit list when multiprocessing.util was imported first:
    # terminate and join children, as its own hook would.
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is not None and not getattr(mp_util, "_exiting", True):
        with contextlib.suppress(Exception):
            mp_util._exit_function()
    logging = sys.modules.get("logging")
    if logging is not None:
        with contextlib.suppress(Exception):
            logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    kind, value = forced
    if kind == "signal":
        signal.signal(value, signal.SIG_DFL)
        os.kill(os.getpid(), value)
        value = 128 + value  # not reached unless the signal is blocked
    os._exit(value)


atexit.register(_keep_exit_code)

import multiprocessing.util  # noqa: E402  (after the keeper: its atexit hook must run later)

from wandb_funnel._worker import signal_watch  # noqa: E402

ShutdownCallback = Callable[[int, str], None]  # (exit_code, reason)

_callbacks: list[tuple[int, ShutdownCallback]] = []  # (priority, callback); low runs first
_exit_hook_pid = -1
_sigterm_hook_pid = -1  # the process that installed our SIGTERM hook (never again there)
_previous_sigterm: Any = None
_first_seen: tuple[int, Any] | None = None  # (pid, SIGTERM's handler) at a first attach off-main
sigterm_runs = 0  # times our SIGTERM hook ran (the signal watcher stops nudging once it has)


def _reset_in_child() -> None:
    # Callbacks registered by the parent belong to the parent's streams and funnel.
    global _exit_hook_pid, _sigterm_hook_pid, _forced_exit
    _callbacks.clear()
    _exit_hook_pid = _sigterm_hook_pid = -1
    _forced_exit = None
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
    """Hold SIGINT and SIGTERM back while the block runs, then deliver each once.

    A shutdown is bounded, and cut short it loses data: a Pool's terminate() often lands
    while its worker is already flushing on the way out, and a second Ctrl-C often lands
    during close(). Held signals still do what they would have done, just after the flush, and
    to the handler installed by then (see ``deliver``). Nested blocks hold too: the outermost
    delivers. Only the main thread can touch signal handlers; elsewhere this holds nothing.
    """
    held: list[int] = []
    saved: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():

        def hold(signum: int, frame: FrameType | None) -> None:
            if signum not in held:
                held.append(signum)

        try:
            for signum in (int(signal.SIGINT), int(signal.SIGTERM)):
                current = signal.getsignal(signum)
                if current is None or current == signal.SIG_IGN:
                    continue  # not installed from Python, or ignored: leave it alone
                signal.signal(signum, hold)
                saved[signum] = current  # only once it is ours to put back
        except BaseException:
            for restored, handler in saved.items():
                signal.signal(restored, handler)
            raise
    try:
        yield
    finally:
        # signal.signal() runs pending handlers before it swaps: a Ctrl-C landing right after
        # SIGINT is restored raises out of SIGTERM's restore. Every handler is put back, every
        # held signal delivered, and the first exception raised at the end.
        first: BaseException | None = None
        for restored, handler in saved.items():
            for _ in range(2):
                try:
                    signal.signal(restored, handler)
                    break
                except BaseException as exc:  # from a handler run on the way in; swap again
                    first = first or exc
        for pending in held:
            try:
                deliver(pending)
            except BaseException as exc:
                first = first or exc
        if first is not None:
            raise first


def deliver(signum: int) -> None:
    """Do what a signal that landed just now would do: call the installed Python handler
    directly (exactly once; what it raises propagates here), or die of ``SIG_DFL``."""
    handler = signal.getsignal(signum)
    if handler is _on_sigterm:
        _handle_sigterm(signum, None)
    elif handler == signal.SIG_DFL:
        os.kill(os.getpid(), signum)
    elif callable(handler):
        handler(signum, sys._getframe(1))
    # SIG_IGN, or not installed from Python: nothing happens, as with a real signal.


def run_shutdown_callbacks(exit_code: int, reason: str) -> None:
    """Run (and forget) every callback, with signals held; each runs once, and a failing one
    never stops the rest."""
    stop: BaseException | None = None
    with signals_held():
        while _callbacks:
            _, callback = _callbacks.pop(0)
            try:
                callback(exit_code, reason)
            except Exception as exc:  # the logging side never fails the user's exit
                print(f"wandb-funnel: shutdown step failed: {exc!r}", file=sys.stderr)
            except BaseException as exc:
                # A handler of a signal we do not hold (SIGUSR1, SIGHUP) asked to exit: the
                # remaining steps (the funnel's close) still run, then its exit goes on.
                stop = stop or exc
    if stop is not None:
        raise stop


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

    def exit_remembering_status(status: object = None) -> None:
        _sys_exit_status[:] = [status]
        original(status)  # type: ignore[arg-type]

    exit_remembering_status._wandb_funnel = True  # type: ignore[attr-defined]
    sys.exit = exit_remembering_status  # type: ignore[assignment]


def _exit_code_now() -> int:
    # An uncaught exception leaves sys.last_value (3.11) / sys.last_exc (3.12+) behind.
    exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if exc is None and _sys_exit_status:
        exc = SystemExit(_sys_exit_status[0])
    return exit_code_from_exception(exc)


def _at_interpreter_exit() -> None:
    """The atexit hook: finish this process's streams and funnel. A signal held meanwhile is
    delivered at the end; what its handler raises cannot change the exit status from inside
    atexit (CPython swallows it), so the keeper applies it after the other exit hooks."""
    global _forced_exit
    if os.getpid() != _exit_hook_pid:
        return  # inherited through fork: the parent's exit, not ours
    natural = _exit_code_now()
    try:
        run_shutdown_callbacks(natural, "interpreter exit")
    except SystemExit as exc:
        chosen = exit_code_from_exception(exc)
        if chosen != natural:  # the same code needs no help, and skips no exit hook
            _forced_exit = ("code", chosen)
    except KeyboardInterrupt:
        _forced_exit = ("signal", int(signal.SIGINT))  # as CPython ends on an uncaught one


_deferred_exit: BaseException | None = None


def _at_process_exit() -> None:
    """The multiprocessing finalizer: a child leaving through ``os._exit`` (Process's
    bootstrap) skips atexit. What a held signal's handler raises waits for
    ``_reraise_at_process_end``: raised here it would skip multiprocessing's remaining exit
    work (a Queue's feeder join, daemon children's terminate)."""
    global _deferred_exit
    if os.getpid() == _exit_hook_pid:
        # Process's bootstrap prints a target's traceback only after these finalizers, when
        # this rank's stream is closed: the console copy gets it now (it propagates here).
        raised = sys.exc_info()[1]
        if raised is not None and not isinstance(raised, SystemExit):
            from wandb_funnel._worker import console

            console.note_traceback(raised, multiprocessing.current_process().name)
        try:
            run_shutdown_callbacks(_exit_code_now(), "interpreter exit")
        except (SystemExit, KeyboardInterrupt) as exc:
            _deferred_exit = exc


def _reraise_at_process_end() -> None:
    """The last finalizer: Process's bootstrap turns a SystemExit from here into the exit
    code, as it would have from the handler without the funnel."""
    global _deferred_exit
    exc, _deferred_exit = _deferred_exit, None
    if exc is not None and os.getpid() == _exit_hook_pid:
        raise exc


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
    multiprocessing.util.Finalize(None, _at_process_exit, exitpriority=100)
    multiprocessing.util.Finalize(None, _reraise_at_process_end, exitpriority=-1000)
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
        multiprocessing.util.Finalize(None, _at_process_exit, exitpriority=100)
        multiprocessing.util.Finalize(None, _reraise_at_process_end, exitpriority=-1000)


def install_sigterm_hook() -> None:
    """Hook SIGTERM in this process: once (never over a handler installed after ours), and
    only from the main thread."""
    global _previous_sigterm, _sigterm_hook_pid, _first_seen
    if _sigterm_hook_pid == os.getpid():
        return
    current = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread():
        # Attached from a thread: the main thread installs later, unless the process has
        # installed a handler of its own since (that one would be displaced).
        if _first_seen is None or _first_seen[0] != os.getpid():
            _first_seen = (os.getpid(), current)
        return
    _sigterm_hook_pid = os.getpid()
    if _first_seen is not None and _first_seen[0] == os.getpid() and _first_seen[1] is not current:
        return
    if current == signal.SIG_IGN:
        return  # the process chose to survive SIGTERM: nothing to do on it
    if current is not _on_sigterm:
        _previous_sigterm = current
        signal.signal(signal.SIGTERM, _on_sigterm)
    signal_watch.arm(lambda: sigterm_runs)  # the handler runs even if SIGTERM lands badly


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    # Called by the signal machinery, our caller is the interrupted frame; called by another
    # handler that chains to what it replaced (Lightning's signal connector does), it is that
    # handler's frame.
    try:
        caller = sys._getframe(1)
    except ValueError:  # pragma: no cover - a signal with no Python frame at all
        caller = None
    if caller is not frame:
        # That handler decides what happens to the process; a handler we replaced still
        # runs (installed before us, it would have been in the chain without us).
        global sigterm_runs, _chaining
        sigterm_runs += 1
        _flush_only()
        previous = _previous_sigterm
        if callable(previous) and not _chaining:
            _chaining = True  # a chain that loops back to us (ours -> h -> ours) ends here
            try:
                previous(signum, frame)
            finally:
                _chaining = False
        return
    _handle_sigterm(signum, frame)


_chaining = False


def _handle_sigterm(signum: int, frame: FrameType | None) -> None:
    global sigterm_runs
    sigterm_runs += 1
    previous = _previous_sigterm
    if callable(previous):
        # The handler we chained decides whether the process ends; we only make sure nothing
        # buffered is lost if it does.
        global _chaining
        _flush_only()
        _chaining = True  # should it call us back (ours -> h -> ours), we only flush
        try:
            previous(signum, frame)
        finally:
            _chaining = False
        return
    run_shutdown_callbacks(EXIT_SIGTERM, "SIGTERM")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


_flush_callbacks: list[Callable[[], None]] = []


def add_flush_callback(callback: Callable[[], None]) -> None:
    """Run ``callback()`` (non-destructive) before a chained SIGTERM handler."""
    if callback not in _flush_callbacks:
        _flush_callbacks.append(callback)


def _flush_only() -> None:
    for callback in list(_flush_callbacks):  # noqa: PERF101  (a copy: callbacks may change)
        try:
            callback()
        except Exception as exc:
            print(f"wandb-funnel: flush on SIGTERM failed: {exc!r}", file=sys.stderr)
