"""The owner keeps a logger running: when it dies before the funnel closes (an OOM kill, a
segfault, or its wandb-core dying under it), a new one is started and continues the run.

The new logger binds the same endpoints, so every rank's socket reconnects by itself; it
answers a rank it does not know with REHELLO, and the rank says hello again and resends what
the dead logger had not saved (``_worker/stream.py``). What the dead one left for it is in
the funnel's private directory (``_logger/continuity.py``).

Restarts are bounded (``max_logger_restarts`` in ``LOGGER_RESTART_WINDOW``) and backed off:
a logger that cannot live (a broken install, a disk that is full) is not restarted forever.
Past the bound the funnel works as it did without a supervisor: ranks count what they could
not send, and say so.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable

from wandb_funnel._constants import LOGGER_RESTART_WINDOW
from wandb_funnel._outcomes import LoggerState, how_it_ended
from wandb_funnel._owner.logger_process import LoggerProcess
from wandb_funnel._protocol.messages import LoggerStart

_POLL = 0.1  # seconds between looks at the logger's pid
# Seconds before the 1st, 2nd, 3rd, later restart in a window (none once the funnel closes:
# the run then needs a logger to finish it, now).
_BACKOFF = (0.0, 0.5, 1.0, 2.0)


def _say(message: str) -> None:
    try:
        print(f"wandb-funnel: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


class Supervisor:
    """Watches the funnel's logger on a thread of the owner; ``stop()`` hands it to close."""

    def __init__(
        self,
        start: LoggerStart,
        logger: LoggerProcess,
        max_restarts: int,
        on_restart: Callable[[LoggerProcess], None],
    ) -> None:
        self._start = start
        self.logger = logger
        self._max = max_restarts
        self._on_restart = on_restart
        self._lock = threading.Lock()  # held while a new logger starts; close waits on it
        self._stopped = threading.Event()  # the funnel closes: the watch ends
        self._restarts: deque[float] = deque()  # when each restart in the window began
        self.restarts = 0
        self.gave_up = False
        self._start_failed: str | None = None  # why the last new logger did not start
        self._abandoned = False  # the close went on without waiting for a restart
        self._thread: threading.Thread | None = None
        if max_restarts > 0:
            self._thread = threading.Thread(
                target=self._watch, name="wandb-funnel-supervisor", daemon=True
            )
            self._thread.start()

    def stop(self, timeout: float) -> LoggerProcess:
        """The funnel closes: the watch ends. A restart under way goes on (the run needs a
        logger to finish it), and a logger found dead now is restarted at once, within the
        bound; waits at most ``timeout`` seconds. Returns the logger to close."""
        self._stopped.set()
        deadline = time.monotonic() + max(0.0, timeout)
        if not self._lock.acquire(timeout=max(0.0, timeout)):
            self._abandoned = True  # a logger started after this is killed at once
            return self.logger
        try:
            dead = LoggerState.of(self.logger.returncode) is not LoggerState.RUNNING
            if self._max > 0 and not self.gave_up and dead:
                self._restart(within=max(0.5, deadline - time.monotonic()))
        finally:
            self._lock.release()
        return self.logger

    def _watch(self) -> None:
        while not self._stopped.wait(_POLL):
            if LoggerState.of(self.logger.returncode) is LoggerState.RUNNING:
                continue
            with self._lock:
                if self._stopped.is_set():
                    return  # the close restarts it, if it must
                if not self._restart():
                    return

    def _restart(self, within: float | None = None) -> bool:
        """Start a new logger for the dead one (lock held); False once past the bound.
        ``within``: seconds the start may take (a close's share), else ``start_timeout``."""
        dead = self.logger
        now = time.monotonic()
        while self._restarts and now - self._restarts[0] > LOGGER_RESTART_WINDOW:
            self._restarts.popleft()
        if len(self._restarts) >= self._max:
            self.gave_up = True
            # No successor will bind it: a rank on this host that waits for one (its unsaved
            # records) sees the socket gone and leaves at once (``Stream._may_be_restarted``).
            if self._start.address.startswith("ipc://"):
                with contextlib.suppress(OSError):
                    os.unlink(self._start.address[len("ipc://") :])
            _say(
                f"the logger (pid {dead.pid}) {how_it_ended(dead.returncode)}; it died "
                f"{len(self._restarts) + 1} times in {LOGGER_RESTART_WINDOW / 60:.0f} minutes "
                f"and is not started again: records the ranks send from now on are lost "
                f"(each rank counts and reports what it could not send)"
            )
            return False
        backoff = _BACKOFF[min(len(self._restarts), len(_BACKOFF) - 1)]
        self._restarts.append(now)
        self.restarts += 1
        limit = f"at most {self._max} in {LOGGER_RESTART_WINDOW / 60:.0f} minutes"
        if self._start_failed is None:
            _say(
                f"the logger (pid {dead.pid}) {how_it_ended(dead.returncode)} before the run "
                f"was closed; starting a new one (restart {self.restarts}, {limit}): it "
                f"continues the run, and the ranks resend what was not saved"
            )
        else:
            _say(f"trying again (restart {self.restarts}, {limit})")
        if backoff:
            self._stopped.wait(backoff)  # cut short by a close: it needs the logger now
        ready_r, ready_w = os.pipe()
        start = self._start._replace(ready_fd=ready_w, generation=self.restarts)
        began = time.monotonic()
        try:
            if within is None:
                logger, _ = LoggerProcess.spawn(start, ready_r, start.options.start_timeout)
            else:
                logger, _ = LoggerProcess.spawn(start, ready_r, within, grace=0.0)
        except Exception as exc:
            self._start_failed = str(exc)
            _say(f"the new logger did not start: {exc}")
            return True  # the watch sees it dead, and tries again within the bound
        self._start_failed = None
        if self._abandoned:  # the funnel closed meanwhile: nobody would ever close it
            logger.kill()
            return False
        self.logger = logger
        self._on_restart(logger)
        _say(f"a new logger (pid {logger.pid}) took over in {time.monotonic() - began:.1f}s")
        return True
