"""The end of a rank's stream: what is left and a goodbye, the logger's receipt, and (when
the logger died and the owner replaces it) the wait for its successor; then, with numbers,
what may be missing from the run. And what a stream says to that successor whenever it comes:
hello again, and every batch not yet saved. ``Stream`` takes these methods from ``StreamEnd``.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any

from wandb_funnel._constants import FINAL_FLUSH_TIMEOUT, RESTART_WAIT, SAVED_WAIT
from wandb_funnel._deadline import Deadline
from wandb_funnel._protocol import codec
from wandb_funnel._protocol.messages import Goodbye, Hello
from wandb_funnel._protocol.sockets import ClientSocket
from wandb_funnel._worker import console, flusher, lifecycle
from wandb_funnel._worker.replay import ReplayBuffer
from wandb_funnel.errors import FunnelWarning

_POKE_INTERVAL = 0.5  # seconds between heartbeats to a logger that may be restarting


def _warn(message: str) -> None:
    warnings.warn(f"wandb-funnel: {message}", FunnelWarning, stacklevel=3)


class StreamEnd:
    """``Stream.close`` and what it waits for (a base of ``Stream``, which holds the state)."""

    endpoint: str
    closed: bool
    dropped: int
    _lock: threading.RLock
    _sock: ClientSocket
    _seq: int
    _replay: ReplayBuffer
    _restarted: bool
    _goodbye: bytes | None
    _last_sent: float
    _logger_pid: int | None
    _rank: int | None
    _hello_message: Hello
    _inflight: tuple[bytes, int, int] | None
    replays: int

    if TYPE_CHECKING:

        def _send_batch(self, timeout: float) -> None: ...
        def _read_reply(self, timeout: float) -> Any: ...
        def _await_ack(
            self, deadline: float, restart_deadline: float | None = None
        ) -> int | None: ...
        def _rank_text(self) -> str: ...
        def logger_alive(self) -> bool: ...

    def close(
        self,
        reason: str,
        timeout: float = FINAL_FLUSH_TIMEOUT,
        exit_code: int = 0,
        restart_by: float | None = None,
        wait_saved: bool = True,
    ) -> None:
        """Send what is left and a goodbye, wait for the logger's receipt; all within
        ``timeout`` seconds (for a logger that died and is being replaced, until
        ``restart_by``, a ``time.monotonic()`` value; default ``RESTART_WAIT`` from now).
        ``wait_saved=False``: not also until the records are on disk (the owner closing the
        funnel: the run's finish comes next, and no logger would replace this one).
        Warns with numbers when anything may be missing from the run."""
        # A signal landing meanwhile waits for the goodbye (its handler may exit the process).
        with lifecycle.signals_held():
            self._close(reason, timeout, exit_code, restart_by, wait_saved)

    def _close(
        self,
        reason: str,
        timeout: float,
        exit_code: int,
        restart_by: float | None,
        wait_saved: bool = True,
    ) -> None:
        close = Deadline(timeout)
        deadline = close.deadline
        if not self._lock.acquire(timeout=close.budget):
            return
        try:
            if self.closed:
                return
            alive = self.logger_alive()
            # Past our own timeout, for a logger that died and is being replaced: a restart
            # takes seconds, more on a loaded machine (8 s seen at 4 jobs on 2 cores).
            if restart_by is None:
                restart_by = time.monotonic() + RESTART_WAIT
            restart = Deadline(max(deadline, restart_by) - close.start, close.start)
            restart_deadline = restart.deadline

            def left() -> float:
                if alive:
                    return close.remaining()
                if self._may_be_restarted():  # the queue drains into its successor
                    return restart.remaining()
                return 0.0

            def room() -> float:
                """Seconds the next send may wait. While the logger is dead, first waits for
                room in slices, so that a restart that will not come (the socket removed)
                ends the wait."""
                while not alive and (t := left()) > 0:
                    if self._sock.wait_for_room(min(t, 0.25)):
                        break
                return left()

            self._send_batch(room())
            try:  # what this process printed last (a traceback) goes before the goodbye
                console.pump(self, lambda frame: self._sock.send_within(frame, room()))
            except Exception:
                pass
            goodbye = codec.encode_goodbye(Goodbye(self._seq, reason, exit_code))
            said_goodbye = self._sock.send_within(goodbye, room())
            if said_goodbye:
                self._goodbye = goodbye
            if said_goodbye and not alive and self._may_be_restarted():
                # Its pid is gone, but the owner is starting a new one that asks us to resend
                # what was not saved: wait for that (a new logger answers us with a REHELLO,
                # and then its Ack).
                alive = True
            received = (
                self._await_ack(deadline, restart_deadline) if said_goodbye and alive else None
            )
            if received is None:
                alive = self.logger_alive()  # no new logger came (past the restart bound)
            if received is not None and self._replay and wait_saved:
                # Received is not yet saved: a logger that dies before wandb-core flushed our
                # last rows would lose them with us gone. A moment more (bounded) until the
                # logger says they are on disk (if it dies meanwhile, until its successor
                # has them, within our timeout).
                self._await_saved(min(deadline, time.monotonic() + SAVED_WAIT), restart_deadline)
            self.closed = True
            # Once the logger confirmed receipt nothing is queued; otherwise a bounded linger
            # lets what is still queued leave (none when the logger is known dead).
            self._sock.close(0.0 if received is not None else left())
            self._report_loss(alive, received, said_goodbye, close.elapsed())
        finally:
            self._lock.release()
            flusher.unregister(self)  # type: ignore[arg-type]
            console.forget(self)

    def _await_saved(self, soon: float, deadline: float) -> None:
        """Until our records are saved, by ``soon``; if the logger dies meanwhile and the
        owner restarts it, until its successor has them, by ``deadline``."""
        waiting_for_a_restart = False
        while self._replay:
            left = (deadline if waiting_for_a_restart else soon) - time.monotonic()
            if left > 0 and self._read_reply(min(left, 0.05)) is not None:
                continue
            if left <= 0 and (waiting_for_a_restart or self.logger_alive()):
                return
            if not self.logger_alive():
                if not self._may_be_restarted():
                    return
                waiting_for_a_restart = True
                self._poke()

    def _say_hello_again(self) -> None:
        """A restarted logger does not know us: say hello with the range we resend, then
        resend every batch it has not saved, then our goodbye if we said it (lock held).
        ZeroMQ keeps the order, so the new logger sees them in this order."""
        inflight = self._inflight
        resume = self._replay.resume(self._seq, None if inflight is None else inflight[2])
        hello = self._hello_message._replace(requested_rank=self._rank, resume=resume)
        if not self._sock.send_within(codec.encode_hello(hello), 0.5):
            return
        self.replays += 1
        for frame in self._replay.frames():
            if not self._sock.send_within(frame, 0.5):
                break  # what did not fit is a gap the logger counts as dropped
        self._last_sent = time.monotonic()
        if self._goodbye is not None:
            self._sock.send_within(self._goodbye, 0.5)

    def _may_be_restarted(self) -> bool:
        """Whether a new logger may still come for our unsaved records: restarts are on and
        the funnel's socket is still there (the owner removes it when the funnel closes: a
        rank logging after that waits for nobody)."""
        if not (self._replay and self._restarted):
            return False
        if self.endpoint.startswith("ipc://"):
            return os.path.exists(self.endpoint[len("ipc://") :])
        return True

    def _poke(self) -> None:
        """An empty batch (a heartbeat) now and then while the logger's pid is gone and a new
        one may come: the only way a new logger hears of a stream that has nothing left to
        send (a closing one), and answers it with REHELLO (lock held)."""
        now = time.monotonic()
        if now - self._last_sent >= _POKE_INTERVAL:
            self._sock.try_send(codec.encode_batch(self._seq, []))
            self._last_sent = now

    def _report_loss(
        self, alive: bool, received: int | None, said_goodbye: bool, waited: float
    ) -> None:
        who = f"rank {self._rank_text()}"
        if not alive:
            unsaved = self._replay.unsaved(self._seq)  # the logger said the rest is in the run
            if unsaved:
                # How long this close waited, and whether its goodbye left: what tells "no
                # new logger came" from "this rank did not wait for one".
                how = f"waited {waited:.1f} s" + ("" if said_goodbye else ", goodbye not sent")
                _warn(
                    f"{who}: the logger (pid {self._logger_pid}) is gone ({how}); up to "
                    f"{unsaved} records from this rank may be missing from the run"
                )
        elif received is None:
            _warn(
                f"{who}: the logger did not confirm receipt within the exit timeout (it is "
                f"behind, or stalled); any of this rank's {self._seq - self.dropped} sent "
                f"records still queued in this process are discarded at exit and missing "
                f"from the run ({self.dropped} more were dropped and counted)"
            )
        elif received < self._seq:
            _warn(f"{who}: {self._seq - received} of {self._seq} records did not reach the run")
