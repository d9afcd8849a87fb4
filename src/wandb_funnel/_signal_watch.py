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
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from types import FrameType

NUDGE_SIGNAL = signal.SIGURG
_WATCHED = frozenset({int(signal.SIGINT), int(signal.SIGTERM)})
# Repeated because a nudge can itself land in the window it is meant to close.
_NUDGE_DELAYS = (0.005, 0.05, 0.25, 1.0, 2.0)

_armed_pid = -1
_sockets: tuple[socket.socket, socket.socket] | None = None


def _do_nothing(signum: int, frame: FrameType | None) -> None:
    """The nudge's handler: being called is the point (the main thread woke up)."""


def arm() -> None:
    """Watch this process's SIGINT and SIGTERM; once per process, from the main thread."""
    global _armed_pid, _sockets
    if _armed_pid == os.getpid() or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(NUDGE_SIGNAL) not in (signal.SIG_DFL, _do_nothing):
        return  # the application uses SIGURG itself
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    try:
        previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    except ValueError:
        previous = None
    if previous != -1:
        if previous is not None:
            signal.set_wakeup_fd(previous)  # someone else's: theirs stays
        reader.close()
        writer.close()
        return
    signal.signal(NUDGE_SIGNAL, _do_nothing)
    _armed_pid, _sockets = os.getpid(), (reader, writer)
    main = threading.main_thread().ident
    assert main is not None
    threading.Thread(target=_watch, args=(reader, main), name="wandb-funnel-signals",
                     daemon=True).start()


def _watch(reader: socket.socket, main_thread: int) -> None:
    while True:
        try:
            caught = reader.recv(256)
        except OSError:
            return
        if not caught:
            return
        if _WATCHED.isdisjoint(caught):
            continue  # our own nudges, and signals nobody loses
        for delay in _NUDGE_DELAYS:
            time.sleep(delay)
            try:
                signal.pthread_kill(main_thread, NUDGE_SIGNAL)
            except OSError:
                return  # the main thread is gone: the process is exiting


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
        pass  # forked from a thread CPython does not count as main: nothing to undo
    reader.close()
    writer.close()


os.register_at_fork(after_in_child=_forget_in_child)
