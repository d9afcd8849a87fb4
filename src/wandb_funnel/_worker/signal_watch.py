"""Make sure a caught SIGTERM or SIGINT reaches its Python handler.

CPython runs a Python signal handler on the main thread only, when that thread next runs
bytecode or is interrupted (EINTR) inside a blocking call. A signal that lands after CPython's
last check and before the main thread enters the call only sets a flag, and the main thread
then sleeps on. The soak caught exactly this: a Pool worker going idle in ``SimpleQueue.get()``
(``sem_wait``) just as ``Pool.terminate()`` sent SIGTERM kept its handler pending forever,
never died, and ``terminate()`` joined it forever (about 1 run in 10 of ``pool-fork``).

The cure is the self-pipe trick CPython offers: ``signal.set_wakeup_fd`` writes each caught
signal's number to a socket, a watcher thread reads it and then interrupts the main thread a
few times with a signal whose handler does nothing (SIGURG: ignored by default, so a stray one
after interpreter shutdown is harmless too). Each interruption makes the main thread run every
pending handler. One that lands after the handler already ran costs a retried system call.

Armed only where it cannot disturb anyone: from the main thread, when no wakeup fd is set
(asyncio sets its own, and takes it over later if it wants it) and SIGURG has no handler.
Nudging stops as soon as our SIGTERM hook has run. ``WANDB_FUNNEL_SIGNAL_WATCH=0`` turns it
off (trio, for one, warns when it finds a wakeup fd already set).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from types import FrameType

NUDGE_SIGNAL = signal.SIGURG
_WATCHED = frozenset({int(signal.SIGINT), int(signal.SIGTERM)})
# Repeated because a nudge can itself land in the window it is meant to close.
_NUDGE_DELAYS = (0.005, 0.05, 0.25, 1.0, 2.0)

_armed_pid = -1
_sockets: tuple[socket.socket, socket.socket] | None = None


def _do_nothing(signum: int, frame: FrameType | None) -> None:
    """The nudge's handler: being called is the point (the main thread woke up)."""


def arm(handler_runs: Callable[[], int]) -> None:
    """Watch this process's SIGINT and SIGTERM; once per process, from the main thread.
    ``handler_runs()`` counts our SIGTERM hook's runs. Best effort: never raises."""
    global _armed_pid
    if _armed_pid == os.getpid() or threading.current_thread() is not threading.main_thread():
        return
    if os.environ.get("WANDB_FUNNEL_SIGNAL_WATCH", "1") == "0":
        return
    if signal.getsignal(NUDGE_SIGNAL) not in (signal.SIG_DFL, _do_nothing):
        return  # the application uses SIGURG itself
    _armed_pid = os.getpid()  # one try per process, even a failed one
    try:
        _arm(handler_runs)
    except Exception:  # out of fds or threads: the process just goes without the watcher
        try:
            _disarm()
        except Exception:
            pass


def _arm(handler_runs: Callable[[], int]) -> None:
    global _sockets
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    if previous != -1:
        # Someone else's (asyncio's): theirs stays, with whatever landed on ours meanwhile.
        signal.set_wakeup_fd(previous)
        writer.close()
        reader.setblocking(False)
        try:
            os.write(previous, reader.recv(256))
        except OSError:
            pass
        reader.close()
        return
    _sockets = (reader, writer)
    signal.signal(NUDGE_SIGNAL, _do_nothing)
    main = threading.main_thread().ident
    assert main is not None
    threading.Thread(
        target=_watch, args=(reader, main, handler_runs), name="wandb-funnel-signals", daemon=True
    ).start()


def _disarm() -> None:
    global _sockets
    if _sockets is None:
        return
    reader, writer = _sockets
    _sockets = None
    current = signal.set_wakeup_fd(-1)
    if current not in (-1, writer.fileno()):
        signal.set_wakeup_fd(current)
    if signal.getsignal(NUDGE_SIGNAL) is _do_nothing:
        signal.signal(NUDGE_SIGNAL, signal.SIG_DFL)
    reader.close()
    writer.close()


def _watch(
    reader: socket.socket,
    main_thread: int,
    handler_runs: Callable[[], int],
    nudge: int = NUDGE_SIGNAL,
) -> None:
    """Read caught signals' numbers from ``reader``; after a SIGINT or SIGTERM, interrupt
    ``main_thread`` with ``nudge`` until ``handler_runs()`` moves (or the schedule ends)."""
    seen = handler_runs()
    while True:
        try:
            caught = reader.recv(256)
        except OSError:
            return
        if not caught:
            return
        runs = handler_runs()
        if _WATCHED.isdisjoint(caught) or runs != seen:
            seen = runs  # our own nudges; or our hook already ran since we last looked
            continue
        for delay in _NUDGE_DELAYS:
            time.sleep(delay)
            if handler_runs() != seen:
                break  # it ran: no more interruptions
            try:
                signal.pthread_kill(main_thread, nudge)
            except OSError:
                return  # the main thread is gone: the process is exiting
        seen = handler_runs()


def _forget_in_child() -> None:
    """A forked child has no watcher thread; its signals must not go to the parent's socket."""
    global _armed_pid, _sockets
    if _sockets is None:
        return
    reader, writer = _sockets
    _armed_pid, _sockets = -1, None
    try:
        current = signal.set_wakeup_fd(-1)
        if current not in (-1, writer.fileno()):
            signal.set_wakeup_fd(current)
    except ValueError:
        # Forked from a thread CPython does not count as main: the wakeup fd still points at
        # the writer's number, so keep it open (a reused number would get signal bytes).
        reader.close()
        return
    reader.close()
    writer.close()


os.register_at_fork(after_in_child=_forget_in_child)
