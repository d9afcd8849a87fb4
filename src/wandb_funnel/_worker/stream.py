"""The worker side: a Stream is one rank's connection to the logger. Its parts: the replay
buffer (``replay.py``), its close (``stream_close.py``), and this process's registry of
streams, flusher thread and exit hooks (``flusher.py``, re-exported here).

``log()`` never waits for the logger. Records are packed at the call site and batched; a batch
leaves when it is full, or within FLUSH_INTERVAL through the flusher thread, or at exit. When
ZeroMQ's queue is full (a slow or dead logger) the batch is dropped and counted; its sequence
numbers tell the logger exactly how many records it never got. A socket inherited through fork
is never used: a forked child gets its own streams.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

from wandb_funnel import _pid
from wandb_funnel._constants import (
    BATCH_BYTES,
    BATCH_RECORDS,
    DEFAULT_REPLAY_MAX_BYTES,
    DEFAULT_REPLAY_MAX_RECORDS,
    FLUSH_INTERVAL,
    HEARTBEAT_INTERVAL,
    SEND_HWM,
)
from wandb_funnel._protocol import codec
from wandb_funnel._protocol.messages import Ack, Blob, Hello, Rehello, Saved, Welcome
from wandb_funnel._protocol.sockets import STREAM_PREFIX, ClientSocket
from wandb_funnel._worker import console, flusher
from wandb_funnel._worker.flusher import close_all, flush_all, open_streams
from wandb_funnel._worker.replay import ReplayBuffer
from wandb_funnel._worker.stream_close import StreamEnd, _warn
from wandb_funnel.errors import ClientClosedError

__all__ = ["Stream", "close_all", "flush_all", "open_streams"]  # the registry's, re-exported

_HOSTNAME = socket.gethostname()
_RUN_INFO_ASK = 0.5  # seconds between Hellos that ask an opening run for its name and dir


class Stream(StreamEnd):
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
        # The batches sent and not yet saved by the logger: after a logger restart they are
        # sent again (the new logger skips what the run already has). Bounded.
        self._replay = ReplayBuffer(replay_records, replay_bytes)
        self._restarted = restarted  # the owner starts a new logger when this one dies
        self.replays = 0  # how many times this stream resent its buffer to a new logger
        self._goodbye: bytes | None = None  # sent: said again to a logger that restarted
        self._sock = ClientSocket(endpoint, self._identity, SEND_HWM, curve)
        self._hello_message = Hello(
            token, self.pid, _HOSTNAME, requested_rank, _pid.pid_start_time(self.pid)
        )
        self._hello = codec.encode_hello(self._hello_message)
        self.run_info: dict[str, Any] | None = None  # from a Welcome, once the run is open
        self._sock.try_send(self._hello)  # a fresh queue always has room
        flusher.register(self)

    # -- the hot path ----------------------------------------------------------------------
    def push(self, packed: bytes, blobs: list[tuple[str, bytes]] | None = None) -> None:
        """Queue one packed record; sends the batch when it is full. Never blocks on the logger.
        ``blobs``: the files it names, as bytes (a rank on another node), sent first."""
        # ``with``, not acquire() then try: that costs 0.25 us less, but a KeyboardInterrupt
        # landing between the two would leave the lock held, and every other thread's log()
        # blocked for good.
        with self._lock:
            if self.closed:
                raise ClientClosedError("wandb_funnel: log() on a finished run")
            if blobs:
                for name, data in blobs:
                    self._send_blob(name, data)
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
                self._replay.keep(parked[2], parked[1], parked[0])
            else:
                self.dropped += parked[1]
                self._replay.forget_blobs(parked[2], parked[2] + parked[1])
                if not self._warned_drop:
                    self._warned_drop = True
                    _warn(
                        f"rank {self._rank_text()}: the logger is not taking records "
                        f"(queue full or logger gone); dropping and counting them"
                    )
                timeout = 0.0  # what is left is numbered and counted now, not waited for

    def _send_blob(self, name: str, data: bytes) -> bool:
        """Send a media file's bytes in chunks, ahead of the record that names it (this
        process's records leave in batches later, so the logger has the file first), and
        keep them until that record is saved (lock held; the record is pushed next, so it is
        numbered ``produced``). Never waits: False as soon as a chunk finds the queue full
        (the media is then missing at the logger, counted there)."""
        frames = [
            codec.encode_blob(Blob(name, offset, len(data), data[offset : offset + BATCH_BYTES]))
            for offset in range(0, max(len(data), 1), BATCH_BYTES)
        ]
        for frame in frames:
            if not self._sock.try_send(frame):
                return False  # (a part sent is never taken for the file: kept as .part)
        self._replay.keep_blob(self.produced, frames)
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
            self._replay.saved(message.seq)
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
