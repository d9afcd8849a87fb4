"""_worker.signal_watch: a caught SIGTERM/SIGINT makes the watcher interrupt the main thread
until our hook has run, and only then. The watcher runs on its own thread here, fed through
the same socketpair CPython's wakeup fd writes to."""

from __future__ import annotations

import signal
import socket
import threading
import time
from types import FrameType

from wandb_funnel._worker import signal_watch

# The watcher under test nudges with its own signal: a watcher armed for real in this process
# by an earlier test (test_signal_rules lands SIGTERMs on handlers not ours) may still be
# nudging with SIGURG for up to 3 s, and those must not count here (1 run in 4 under load).
_TEST_NUDGE = signal.SIGWINCH


def _watch_with(runs: list[int]) -> tuple[socket.socket, threading.Thread, list[float]]:
    nudges: list[float] = []

    def count_nudge(signum: int, frame: FrameType | None) -> None:
        nudges.append(time.monotonic())

    previous = signal.signal(_TEST_NUDGE, count_nudge)
    reader, writer = socket.socketpair()
    main = threading.main_thread().ident
    assert main is not None
    watcher = threading.Thread(
        target=signal_watch._watch, args=(reader, main, lambda: runs[0], _TEST_NUDGE)
    )
    watcher.start()
    watcher.previous_handler = previous  # type: ignore[attr-defined]
    watcher.reader = reader  # type: ignore[attr-defined]
    return writer, watcher, nudges


def _stop(writer: socket.socket, watcher: threading.Thread) -> None:
    writer.close()  # the watcher reads EOF and returns
    watcher.join(5.0)
    assert not watcher.is_alive()
    watcher.reader.close()  # type: ignore[attr-defined]
    signal.signal(_TEST_NUDGE, watcher.previous_handler)  # type: ignore[attr-defined]


def _sleep_on_main_thread(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.01)  # handlers of nudges run between these


def test_a_sigterm_whose_hook_has_not_run_gets_the_main_thread_nudged() -> None:
    runs = [0]
    writer, watcher, nudges = _watch_with(runs)
    try:
        writer.send(bytes([signal.SIGTERM]))
        _sleep_on_main_thread(0.4)  # the first nudges come at 5 ms, 55 ms, 305 ms
        assert len(nudges) >= 2
        runs[0] += 1  # our hook ran: the watcher stops interrupting
        count = len(nudges)
        _sleep_on_main_thread(1.5)
        assert len(nudges) <= count + 1  # at most one already on its way
    finally:
        _stop(writer, watcher)


def test_signals_other_than_sigint_and_sigterm_cause_no_nudge() -> None:
    runs = [0]
    writer, watcher, nudges = _watch_with(runs)
    try:
        writer.send(bytes([signal.SIGUSR1, signal_watch.NUDGE_SIGNAL]))
        _sleep_on_main_thread(0.4)
        assert nudges == []
    finally:
        _stop(writer, watcher)
