"""The worker side: a Stream is one rank's connection to the logger, plus this process's
flusher thread and exit hooks.

``log()`` never waits for the logger. Records are packed at the call site and batched; a batch
leaves when it is full, or within FLUSH_INTERVAL through the flusher thread, or at exit. When
ZeroMQ's queue is full (a slow or dead logger) the batch is dropped and counted; its sequence
numbers tell the logger exactly how many records it never got. A socket inherited through fork
is never used: a forked child gets its own streams.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import warnings
import weakref
from collections import deque
from typing import Any

from wandb_funnel import _pid
from wandb_funnel._constants import (
    BATCH_BYTES,
    BATCH_RECORDS,
    DEFAULT_REPLAY_MAX_BYTES,
    DEFAULT_REPLAY_MAX_RECORDS,
    EXIT_SIGINT,
    EXIT_SIGTERM,
    FINAL_FLUSH_TIMEOUT,
    FLUSH_INTERVAL,
    HEARTBEAT_INTERVAL,
    RESTART_WAIT,
    SAVED_WAIT,
    SEND_HWM,
)
from wandb_funnel._protocol import codec
from wandb_funnel._protocol.messages import Ack, Blob, Goodbye, Hello, Rehello, Saved, Welcome
from wandb_funnel._protocol.sockets import STREAM_PREFIX, ClientSocket, term_process_context
from wandb_funnel._worker import console, lifecycle, system
from wandb_funnel.errors import ClientClosedError, FunnelWarning

_HOSTNAME = socket.gethostname()
_POKE_INTERVAL = 0.5  # seconds between heartbeats to a logger that may be restarting
_RUN_INFO_ASK = 0.5  # seconds between Hellos that ask an opening run for its name and dir


class Stream:
    """One rank's ordered channel to the logger. Thread-safe; owned by the process that made it."""

    def __init__(
        self,
        endpoint: str,
        token: str,
        requested_rank: int | None,
        logger_pid: int | None = None,
        logger_host: str | None = None,
        curve: dict[str, str] | None = None,
        replay_records: int = DEFAULT_REPLAY_MAX_RECORDS,
        replay_bytes: int = DEFAULT_REPLAY_MAX_BYTES,
        restarted: bool = False,
    ) -> None:
        self.pid = os.getpid()
        self.endpoint = endpoint
        self._logger_pid = logger_pid
        self._logger_host = logger_host
        # ZeroMQ reserves routing ids that start with a zero byte.
        self._identity = STREAM_PREFIX + os.urandom(11)
        self._lock = threading.RLock()
        self._buf: list[bytes] = []
        self._buf_bytes = 0
        self._buf_since = 0.0
        # (frame, records, first_seq): see _send_batch
        self._inflight: tuple[bytes, int, int] | None = None
        self._last_sent = time.monotonic()  # for heartbeats: silence means death to a remote logger
        self._seq = 0  # records numbered so far: sent or dropped
        self.dropped = 0
        self._warned_drop = False
        self._rank = requested_rank
        self._welcomed = False
        self.closed = False
        # The replay buffer: batches sent and not yet saved by the logger, oldest first, as
        # (first_seq, records, frame). After a logger restart they are sent again (the new
        # logger skips what the run already has). Bounded: past the bound the oldest are
        # forgotten, and a restart then counts them as dropped.
        self._replay: deque[tuple[int, int, bytes]] = deque()
        self._replay_records = 0
        self._replay_bytes = 0
        self._replay_max = (replay_records, replay_bytes)
        self._restarted = restarted  # the owner starts a new logger when this one dies
        self._saved = 0  # the logger saved every record numbered below this
        self.replays = 0  # how many times this stream resent its buffer to a new logger
        self._goodbye: bytes | None = None  # sent: said again to a logger that restarted
        self._sock = ClientSocket(endpoint, self._identity, SEND_HWM, curve)
        self._hello_message = Hello(
            token, self.pid, _HOSTNAME, requested_rank, _pid.pid_start_time(self.pid)
        )
        self._hello = codec.encode_hello(self._hello_message)
        self.run_info: dict[str, Any] | None = None  # from a Welcome, once the run is open
        self._sock.try_send(self._hello)  # a fresh queue always has room
        _register(self)

    # -- the hot path ----------------------------------------------------------------------
    def push(self, packed: bytes) -> None:
        """Queue one packed record; sends the batch when it is full. Never blocks on the logger."""
        # ``with``, not acquire() then try: that costs 0.25 us less, but a KeyboardInterrupt
        # landing between the two would leave the lock held, and every other thread's log()
        # blocked for good.
        with self._lock:
            if self.closed:
                raise ClientClosedError("wandb_funnel: log() on a finished run")
            buf = self._buf
            if not buf:
                self._buf_since = time.monotonic()
            buf.append(packed)
            self._buf_bytes += len(packed)
            if len(buf) >= BATCH_RECORDS or self._buf_bytes >= BATCH_BYTES:
                self._send_batch(0.0)

    def _send_batch(self, timeout: float) -> None:
        # Caller holds the lock: an RLock, because a signal handler running on this thread
        # (the user's, calling finish()) may re-enter here while an outer call is mid-send.
        # So a batch is numbered and parked in ``_inflight`` before any call that can be
        # interrupted, and whoever runs first sends it: the handler's close() sends the parked
        # batch before the newer records and the goodbye, and the interrupted call then sees
        # it is no longer its own. The one remaining overlap (interrupted after its send
        # returned, before it cleared the slot) sends the batch twice; the logger takes the
        # numbers once and counts the replay as one junk frame.
        while True:
            parked = self._inflight
            if parked is None:
                batch = self._buf
                if not batch:
                    return
                first, count = self._seq, len(batch)
                frame = codec.encode_batch(first, batch)
                # Allocated before the check (an allocation may run the GC, and a __del__ a
                # pending handler); from the check on, only stores: no handler runs between.
                fresh: list[bytes] = []
                parked = (frame, count, first)
                if self._buf is not batch or len(batch) != count:
                    continue  # a handler sent these, or logged more, while we encoded them
                self._buf = fresh
                self._seq = first + count
                self._buf_bytes = 0
                self._inflight = parked
            sent = self._sock.send_within(parked[0], timeout)
            if self._inflight is not parked:
                return  # a handler sent it, and everything after it, while we were away
            self._inflight = None
            if sent:
                self._last_sent = time.monotonic()
                self._keep_for_replay(parked[2], parked[1], parked[0])
            else:
                self.dropped += parked[1]
                if not self._warned_drop:
                    self._warned_drop = True
                    _warn(
                        f"rank {self._rank_text()}: the logger is not taking records "
                        f"(queue full or logger gone); dropping and counting them"
                    )
                timeout = 0.0  # what is left is numbered and counted now, not waited for

    def _keep_for_replay(self, first: int, count: int, frame: bytes) -> None:
        """Hold a sent batch until the logger says it is saved (caller holds the lock): two
        appends and a comparison, the cost ``log()`` pays for surviving a logger's death."""
        if not count:
            return
        self._replay.append((first, count, frame))
        self._replay_records += count
        self._replay_bytes += len(frame)
        max_records, max_bytes = self._replay_max
        while self._replay and (
            self._replay_records > max_records or self._replay_bytes > max_bytes
        ):
            _, old_count, old_frame = self._replay.popleft()
            self._replay_records -= old_count
            self._replay_bytes -= len(old_frame)

    def _forget_saved(self, seq: int) -> None:
        """The logger saved every record below ``seq``: drop those batches (lock held)."""
        if seq <= self._saved:
            return
        self._saved = seq
        replay = self._replay
        while replay and replay[0][0] + replay[0][1] <= seq:
            _, count, frame = replay.popleft()
            self._replay_records -= count
            self._replay_bytes -= len(frame)

    def _say_hello_again(self) -> None:
        """A restarted logger does not know us: say hello with the range we resend, then
        resend every batch it has not saved, then our goodbye if we said it (lock held).
        ZeroMQ keeps the order, so the new logger sees them in this order."""
        first = self._replay[0][0] if self._replay else self._seq
        if self._inflight is not None:
            first = min(first, self._inflight[2])
        hello = self._hello_message._replace(requested_rank=self._rank, resume=(first, self._seq))
        if not self._sock.send_within(codec.encode_hello(hello), 0.5):
            return
        self.replays += 1
        for _, _, frame in list(self._replay):
            if not self._sock.send_within(frame, 0.5):
                break  # what did not fit is a gap the logger counts as dropped
        self._last_sent = time.monotonic()
        if self._goodbye is not None:
            self._sock.send_within(self._goodbye, 0.5)

    def send_blob(self, name: str, data: bytes) -> bool:
        """Send a media file's bytes in chunks, ahead of the record that names it (this
        process's records leave in batches later, so the logger has the file first). Never
        waits: False as soon as a chunk finds the queue full (the media is then dropped)."""
        with self._lock:
            if self.closed:
                return False
            for offset in range(0, max(len(data), 1), BATCH_BYTES):
                chunk = data[offset : offset + BATCH_BYTES]
                frame = codec.encode_blob(Blob(name, offset, len(data), chunk))
                if not self._sock.try_send(frame):
                    return False
            self._last_sent = time.monotonic()
            return True

    def pump_console(self) -> None:
        """Send this process's console text, if this stream carries it (the flusher's call).
        Skipped when another thread holds the stream (a close pumps it itself)."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            if not self.closed:
                console.pump(self, self._sock.try_send)
        finally:
            self._lock.release()

    def send_side(self, frame: bytes) -> bool:
        """Send a frame beside the records (system metrics); never waits."""
        with self._lock:
            return not self.closed and self._sock.try_send(frame)

    def send_control(self, frame: bytes) -> bool:
        """Send a config/summary update after everything logged before it."""
        with self._lock:
            if self.closed:
                raise ClientClosedError("wandb_funnel: update on a finished run")
            self._send_batch(0.0)
            sent = self._sock.send_within(frame, 0.0)
        if not sent:
            _warn(f"rank {self._rank_text()}: a config/summary update was dropped (queue full)")
        return sent

    def flush(self, timeout: float = 0.0) -> None:
        """Send whatever is buffered now (waiting at most ``timeout`` for queue room)."""
        with self._lock:
            if not self.closed:
                self._send_batch(timeout)

    def flush_if_stale(self, now: float) -> None:
        if not self._lock.acquire(timeout=FLUSH_INTERVAL):
            return
        try:
            if self.closed:
                return
            # The logger's word, as it comes: what it saved, or that it restarted.
            while self._read_reply(0.0) is not None:
                pass
            if self._buf and now - self._buf_since >= FLUSH_INTERVAL:
                self._send_batch(0.0)
            elif (
                not self._buf
                and now - self._last_sent >= HEARTBEAT_INTERVAL
                # An empty batch: "still here". A logger on another host cannot see our pid,
                # so it tells a quiet rank from a dead one by these.
                and self._sock.try_send(codec.encode_batch(self._seq, []))
            ):
                self._last_sent = now
        finally:
            self._lock.release()

    # -- the end of a stream ---------------------------------------------------------------
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
        started = time.monotonic()
        deadline = started + timeout
        if not self._lock.acquire(timeout=max(0.0, timeout)):
            return
        try:
            if self.closed:
                return
            alive = self.logger_alive()
            # Past our own timeout, for a logger that died and is being replaced: a restart
            # takes seconds, more on a loaded machine (8 s seen at 4 jobs on 2 cores).
            if restart_by is None:
                restart_by = time.monotonic() + RESTART_WAIT
            restart_deadline = max(deadline, restart_by)

            def left() -> float:
                if alive:
                    return max(0.0, deadline - time.monotonic())
                if self._may_be_restarted():  # the queue drains into its successor
                    return max(0.0, restart_deadline - time.monotonic())
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
            self._report_loss(alive, received, said_goodbye, time.monotonic() - started)
        finally:
            self._lock.release()
            _unregister(self)
            console.forget(self)

    def _await_ack(self, deadline: float, restart_deadline: float | None = None) -> int | None:
        """The logger's receipt, by ``deadline``; if its pid is gone and the owner restarts
        it, by ``restart_deadline``, poking the address so that its successor hears of us."""
        while True:
            left = deadline - time.monotonic()
            if left > 0:
                ack = self._read_reply(min(left, 0.05))
                if isinstance(ack, Ack):
                    return ack.received
                if ack is not None or self.logger_alive():
                    continue
            elif self.logger_alive():
                return None  # a live logger had its time: it is behind, or stalled
            # Its pid is gone (looked at past the deadline too: a close whose budget went on
            # sending must not leave for a logger that is being replaced).
            if not self._may_be_restarted():
                return None
            if restart_deadline is None or time.monotonic() >= restart_deadline:
                return None
            deadline = max(deadline, restart_deadline)
            self._poke()

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
            unsaved = self._seq - self._saved  # the logger said the rest is in the run
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

    def logger_alive(self) -> bool:
        """False only when we know for sure: the logger's pid is on this host and gone."""
        if self._logger_pid is None or self._logger_host not in (None, _HOSTNAME):
            return True
        return _pid.pid_alive(self._logger_pid)

    # -- the rank the logger assigned ------------------------------------------------------
    def wait_welcome(self, timeout: float) -> bool:
        """Wait (bounded) until the logger has answered our hello; True once it has.

        Polls in short slices, so other threads' log() calls are never held up for long, and
        gives up at once when the logger is known to be dead.
        """
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if self._welcomed or self.closed:
                    return self._welcomed
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                if self._read_reply(min(left, 0.05)) is None and not self.logger_alive():
                    return False

    def _read_reply(self, timeout: float) -> Any:
        """Read one reply from the logger (caller holds the lock); a Welcome sets our rank."""
        frame = self._sock.recv_within(timeout)
        if frame is None:
            return None
        try:
            message = codec.decode(frame, 1 << 16)
        except codec.DecodeError:
            return None
        if isinstance(message, Welcome):
            self._rank = message.rank
            self._welcomed = True
            if message.run is not None:
                self.run_info = message.run
            if message.logger_pid is not None:
                self._logger_pid = message.logger_pid  # a restarted logger is a new process
        elif isinstance(message, Saved):
            self._forget_saved(message.seq)
        elif isinstance(message, Rehello):
            self._say_hello_again()
        return message

    def fetch_run_info(self, timeout: float) -> dict[str, Any] | None:
        """What the open run says about itself (name, dir, url, ...), waiting (bounded) for
        it: an online run opens in the background, so the Welcome may have come without it.
        Says Hello again every ``_RUN_INFO_ASK`` seconds, which the logger answers with a
        Welcome; None when it did not come in time, or the logger is known to be gone."""
        deadline = time.monotonic() + timeout
        asked = time.monotonic()  # the Hello sent at construction asked
        while True:
            with self._lock:
                if self.run_info is not None or self.closed:
                    return self.run_info
                now = time.monotonic()
                if now >= deadline:
                    return None
                if self._welcomed and now - asked >= _RUN_INFO_ASK:
                    self._sock.try_send(self._hello)
                    asked = now
                # Short slices under the lock: another thread's log() waits at most that long.
                if self._read_reply(min(deadline - now, 0.01)) is None and not self.logger_alive():
                    return None

    def rank(self, timeout: float) -> int | None:
        """This stream's rank: the logger's answer, or the requested one if it never came."""
        self.wait_welcome(timeout)
        return self._rank

    def _rank_text(self) -> str:
        return "?" if self._rank is None else str(self._rank)

    @property
    def produced(self) -> int:
        return self._seq + len(self._buf)  # parked records are numbered already


def _warn(message: str) -> None:
    warnings.warn(f"wandb-funnel: {message}", FunnelWarning, stacklevel=3)


# -- this process's streams, its flusher thread, and its exit ----------------------------

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


def _register(stream: Stream) -> None:
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


def _unregister(stream: Stream) -> None:
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
