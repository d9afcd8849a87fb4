"""This process's streams (the registry), its flusher thread, and their close at exit.

Every ``Stream`` registers here when it is made. One daemon thread per process (the flusher)
sends each stream's stale batch within ``FLUSH_INTERVAL``, reads the logger's replies (what it
saved, or that it restarted), sends heartbeats and console text, and ticks this process's
system metrics. At exit every stream of this process is closed within one budget. A forked
child starts with none of it: the parent's streams, lock and thread did not come along in any
usable state.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from typing import TYPE_CHECKING

from wandb_funnel._constants import (
    EXIT_SIGINT,
    EXIT_SIGTERM,
    FINAL_FLUSH_TIMEOUT,
    FLUSH_INTERVAL,
    RESTART_WAIT,
)
from wandb_funnel._protocol.sockets import term_process_context
from wandb_funnel._worker import lifecycle, system

if TYPE_CHECKING:
    from wandb_funnel._worker.stream import Stream

_streams: weakref.WeakSet[Stream] = weakref.WeakSet()
# Re-entrant: the SIGTERM handler runs on the main thread, which may already hold it.
_registry_lock = threading.RLock()
_flusher_stop: threading.Event | None = None  # set to stop the running flusher thread


def _reset_in_child() -> None:
    # The parent's streams, lock and thread did not come along in any usable state.
    global _streams, _registry_lock, _flusher_stop
    _streams = weakref.WeakSet()
    _registry_lock = threading.RLock()
    _flusher_stop = None


os.register_at_fork(after_in_child=_reset_in_child)


def register(stream: Stream) -> None:
    """Count ``stream`` among this process's, starting the flusher if none runs."""
    global _flusher_stop
    with _registry_lock:
        _streams.add(stream)
        if _flusher_stop is None:
            # Each flusher thread gets its own stop event, so a stopped one never revives.
            _flusher_stop = threading.Event()
            threading.Thread(
                target=_flush_loop, args=(_flusher_stop,), name="wandb-funnel-flush", daemon=True
            ).start()
    # Streams close before a funnel the same process owns (priority 0 < 10).
    lifecycle.add_shutdown_callback(_close_all_on_exit, priority=0)
    lifecycle.add_flush_callback(flush_all)


def unregister(stream: Stream) -> None:
    with _registry_lock:
        _streams.discard(stream)


def _flush_loop(stop: threading.Event) -> None:
    while not stop.wait(FLUSH_INTERVAL / 2):
        now = time.monotonic()
        with _registry_lock:
            streams = list(_streams)
        for stream in streams:
            try:
                stream.flush_if_stale(now)
                stream.pump_console()
            except Exception as exc:  # never let the flusher die silently
                print(f"wandb-funnel: flusher: {exc!r}", file=sys.stderr)
        mine = [s for s in streams if s.pid == os.getpid() and not s.closed]
        if mine:  # this process's system metrics, through its first open stream
            try:
                system.tick(mine[0], now)
            except Exception as exc:
                print(f"wandb-funnel: system metrics: {exc!r}", file=sys.stderr)


def _stop_flusher() -> None:
    global _flusher_stop
    with _registry_lock:
        stop, _flusher_stop = _flusher_stop, None
    if stop is not None:
        stop.set()


def open_streams() -> list[Stream]:
    with _registry_lock:
        return [s for s in _streams if s.pid == os.getpid() and not s.closed]


def flush_all() -> None:
    """Send every stream's buffered records now, without closing anything."""
    for stream in open_streams():
        stream.flush(0.0)


def close_all(reason: str, timeout: float = FINAL_FLUSH_TIMEOUT, exit_code: int = 0) -> None:
    """Close every stream of this process and let their frames leave; bounded by ``timeout``."""
    deadline = time.monotonic() + timeout
    restart_by = time.monotonic() + RESTART_WAIT  # one bound for all: not one per stream
    for stream in open_streams():
        stream.close(reason, max(0.0, deadline - time.monotonic()), exit_code, restart_by)
    _stop_flusher()
    term_process_context(max(0.1, deadline - time.monotonic()))


def _close_all_on_exit(exit_code: int, reason: str) -> None:
    # A rank that raised reports it (the run then ends non-zero). A rank stopped by a signal
    # does not: Pool's terminate() and torchrun's SIGTERM are how workers normally end, and
    # what a signal means for the run is for its owner to say.
    failed = 0 if exit_code in (EXIT_SIGINT, EXIT_SIGTERM) else exit_code
    close_all(reason, exit_code=failed)
