"""The logger's receiving side: a thread that owns the socket and speaks the protocol.

It takes frames off the socket as fast as they come, decodes them, assigns ranks, numbers
and receipts each stream's records, notices dead ranks, and hands plain events to the writer
(the logger's main thread, which may be slowed down by wandb). Its queue of events is bounded
in records: when the writer falls that far behind, the receiver goes on reading and counts
the batches that do not fit as dropped, from their headers alone. It never stops reading:
a worker's last batches and its GOODBYE must reach us within the worker's exit timeout, or
what they account for would be missing with no count (docs/DESIGN.md, "Two threads").
"""

from __future__ import annotations

import os
import queue
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from wandb_funnel._constants import BATCH_RECORDS, EXIT_OWNER_LOST, REMOTE_SILENCE
from wandb_funnel._logger.blobs import BlobWriter
from wandb_funnel._logger.close_request import CloseRequests
from wandb_funnel._pid import pid_alive
from wandb_funnel._protocol import codec
from wandb_funnel._protocol.messages import (
    Ack,
    Blob,
    Close,
    Goodbye,
    Hello,
    Record,
    RecordBatch,
    Saved,
    UpdateKind,
    Welcome,
)
from wandb_funnel._protocol.messages import Update as UpdateMessage
from wandb_funnel._protocol.sockets import LoggerSocket

_TICK = 0.05  # seconds between checks when the socket is quiet
# A receiver that has not seen its socket empty for this long is behind on its input. (Idle,
# it sees it empty every _TICK; keeping up, after every few hundred frames.)
_DRAINED_WITHIN = 0.25
_LIVENESS_PERIOD = 0.25  # seconds between checks that ranks still live
# A rank whose pid is dead is declared gone only once the socket was found empty at least
# this long after its last frame: a rank that exited right after a burst may have thousands
# of frames still queued, and a backlog is not a death.
_GONE_QUIET = 1.0
_DROP_REPORT_PERIOD = 5.0  # seconds between log lines about drops with the same cause
_REHELLO_PERIOD = 0.5  # a stranger's frames get one REHELLO per this many seconds


def log_to_stderr(message: str) -> None:
    """One line on the logger's stderr (the owner's terminal), prefixed with who says it."""
    try:
        print(f"wandb-funnel logger: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        # stderr is a pipe whose reader is gone (`| tee` hit by Ctrl-C) or closed: a message
        # must never cost the run its summary and finish.
        pass


# ---- events for the writer -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Attached:
    rank: int
    pid: int = 0  # the rank's process (the owner's pid tells the owner's rank)


@dataclass(frozen=True, slots=True)
class Records:
    rank: int
    records: list[Record]
    end_seq: int = 0  # one past the batch's last sequence number
    replayed: bool = False  # resent to this (restarted) logger: the run may have some


@dataclass(frozen=True, slots=True)
class Update:
    rank: int
    kind: UpdateKind
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Ended:
    """A rank finished (said goodbye, with its exit code) or is gone (died)."""

    rank: int
    gone: bool
    exit_code: int = 0


Event = Attached | Records | Update | Ended


@dataclass(slots=True)
class _Peer:
    """What the receiver knows of one stream (one rank of one process)."""

    rank: int
    pid: int
    host: str
    pid_start: int | None
    last_seen: float
    next_seq: int = 0
    received: int = 0
    ended: bool = False
    skip_below: int = 0  # resent records below this are in the run already (a restart)
    replay_until: int = 0  # records below this were resent to this logger
    dropped: int = 0  # this stream's records counted as dropped
    gone: bool = False  # died without a goodbye


class Receiver(threading.Thread):
    """Owns the logger socket until ``stop()``; all socket use happens on this thread."""

    def __init__(
        self,
        sock: LoggerSocket,
        token: str,
        max_frame: int,
        max_queued_records: int,
        first_auto_rank: int = 1,
        staging: str | None = None,
        close_requests: CloseRequests | None = None,
        generation: int = 0,
        saved: dict[int, int] | None = None,
        used_ranks: set[int] | None = None,
    ) -> None:
        super().__init__(name="wandb-funnel-receiver", daemon=True)
        self._sock = sock
        self._token = token
        self._max_frame = max_frame
        self.blobs = BlobWriter(staging)  # media bytes from ranks on other nodes
        self._host = socket.gethostname()
        self._peers: dict[bytes, _Peer] = {}
        self._used_ranks: set[int] = set(used_ranks or ())
        # A restarted logger (generation > 0): every rank's records below saved[rank] are in
        # the run already; streams it does not know are asked to say hello again.
        self._generation = generation
        self._saved_before = dict(saved or {})
        self._asked: dict[bytes, float] = {}  # strangers asked to say hello again, and when
        self.stale_frames = 0  # frames of streams the dead logger knew, before their hello
        self.replayed = 0  # records resent to this logger after a restart
        self._saved_lock = threading.Lock()
        self._saved_to_send: dict[int, int] = {}  # rank -> Saved point not yet told
        # Ranks the logger assigns start here: 1 after the owner's 0, or the world size in a
        # launched job, so a DataLoader worker never takes a rank a launcher rank will claim.
        self._next_rank = first_auto_rank
        self._caught_up_at = 0.0
        self._stopping = threading.Event()
        self.events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._queued = 0  # records handed to the writer and not yet taken
        self._room = threading.Lock()
        self._max_queued = max_queued_records
        self.closer: bytes | None = None
        self.footer = True  # the owner's CLOSE: print wandb's end-of-run footer
        # The owner's CLOSE goes here, out of band of the events: behind a backlog of queued
        # records the writer would see it only after writing them all, past its deadline.
        self.close_requests = close_requests if close_requests is not None else CloseRequests()
        # Accounting (read by the writer once this thread has stopped).
        self.dropped = 0
        self.junk_frames = 0
        self.rejected_peers = 0
        self.auth_failures = 0  # TCP peers refused by the CURVE handshake
        self.dead_ranks: list[int] = []
        self._unreported: dict[str, int] = {}  # drops not yet logged, by cause
        self.failure: BaseException | None = None
        # What the open run says about itself, for the ranks' Welcome: set once (one
        # assignment, atomic) by the writer when the run is open; None until then.
        self.run_info: dict[str, Any] | None = None

    # -- the writer's side -------------------------------------------------------------------
    def post_saved(self, moved: dict[int, int]) -> None:
        """The writer's news: these ranks' records below these points are on disk. Told to
        each rank by this thread (the socket is its own)."""
        with self._saved_lock:
            self._saved_to_send.update(moved)

    def _send_saved(self) -> None:
        with self._saved_lock:
            moved, self._saved_to_send = self._saved_to_send, {}
        if not moved:
            return
        for identity, peer in list(self._peers.items()):
            seq = moved.get(peer.rank)
            if seq is not None:  # an ended rank too: it waits a moment for this at exit
                self._sock.reply(identity, codec.encode_saved(Saved(seq)))

    def taken(self, records: int) -> None:
        """The writer consumed ``records`` records: room for that many more."""
        with self._room:
            self._queued -= records

    def socket_drained(self, now: float) -> bool:
        """Whether this thread found the socket empty lately. When it has not, frames wait
        in ZeroMQ's queues unread (the logger is saturated), and a straggler's records may be
        among them: an empty event queue alone does not mean the writer has caught up."""
        return now - self._caught_up_at <= _DRAINED_WITHIN

    def stop(self, timeout: float) -> None:
        """Stop reading (after taking what is already queued); bounded."""
        self._stopping.set()
        self.join(timeout)

    @property
    def ranks(self) -> int:
        return len(self._peers)

    def received(self) -> int:
        """Records taken in from every stream so far (safe from another thread)."""
        return sum(p.received for p in list(self._peers.values()))

    def everything_saved(self) -> list[tuple[bytes, bytes]]:
        """A ``Saved`` for every stream up to what it sent (once the run is finished)."""
        return [
            (identity, codec.encode_saved(Saved(peer.next_seq)))
            for identity, peer in list(self._peers.items())
        ]

    def used_ranks(self) -> set[int]:
        """Every rank handed out so far (safe from another thread)."""
        return set(self._used_ranks)

    def peers(self) -> list[dict[str, Any]]:
        """Every stream as plain data (for ``wandb-funnel status``; safe from another
        thread: a snapshot of counters)."""
        return [
            {
                "rank": p.rank,
                "pid": p.pid,
                "host": p.host,
                "ended": p.ended,
                "gone": p.gone,
                "dropped": p.dropped,
                "received": p.received,
            }
            for p in list(self._peers.values())
        ]

    def unfinished(self) -> list[tuple[int, int]]:
        """(rank, pid) of every stream that has neither said goodbye nor died."""
        return [(p.rank, p.pid) for p in list(self._peers.values()) if not p.ended]

    # -- the thread ----------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # never die silently: the run closes, saying why
            self.failure = exc
            # The request first, with nothing in it that could raise (a repr can): without
            # it the run would wait for a CLOSE that this thread can no longer take in.
            self.close_requests.ask(EXIT_OWNER_LOST, None, f"receiver failed: {type(exc).__name__}")
            log_to_stderr(f"receiver failed: {exc!r}")

    def _serve(self) -> None:
        next_check = 0.0
        next_report = time.monotonic() + _DROP_REPORT_PERIOD
        while not self._stopping.is_set():
            if not self._sock.wait(_TICK) or self._drain(200):
                self._caught_up_at = time.monotonic()
            now = time.monotonic()
            if now >= next_check:
                next_check = now + _LIVENESS_PERIOD
                self._check_liveness()
            if now >= next_report:
                next_report = now + _DROP_REPORT_PERIOD
                self._report_drops()
            self._send_saved()
        self._drain(1_000_000)  # what is already queued, bounded by HWMs
        self._report_drops()

    def _drain(self, limit: int) -> bool:
        """Take up to ``limit`` frames; True when the socket ran empty."""
        for _ in range(limit):
            message = self._sock.recv_nowait()
            if message is None:
                return True
            identity, frames = message
            if len(frames) != 1:
                self.junk_frames += 1
                continue
            # Nearly full: a record batch that does not fit is counted from its header alone;
            # decoding it would be wasted. (An unlocked read: a stale value costs one decode.)
            if self._queued + BATCH_RECORDS > self._max_queued and self._skip_batch(
                identity, frames[0]
            ):
                continue
            try:
                decoded = codec.decode(frames[0], self._max_frame)
            except codec.DecodeError:
                self.junk_frames += 1
                continue
            self._handle(identity, decoded)
        return False

    def _skip_batch(self, identity: bytes, frame: bytes) -> bool:
        """Count a record batch that does not fit as dropped, without decoding it. False when
        ``frame`` is not a batch from a known peer, or fits: it then goes the normal way.
        (Its records are not checked: a malformed batch is counted as dropped, not junk.)"""
        peer = self._peers.get(identity)
        header = codec.peek_batch(frame) if len(frame) <= self._max_frame else None
        if peer is None or header is None or self._queued + header[1] <= self._max_queued:
            return False
        peer.last_seen = time.monotonic()
        self._records(peer, header[0], header[1], None)
        return True

    def _handle(self, identity: bytes, message: Any) -> None:
        if isinstance(message, Hello):
            self._hello(identity, message)
            return
        if isinstance(message, Close):
            if message.token != self._token:
                self.rejected_peers += 1
            elif self.closer is None:
                self.closer = identity
                self.footer = message.footer
                self.close_requests.ask(message.exit_code, message.budget, "closed by the owner")
            return
        peer = self._peers.get(identity)
        if peer is None:
            if self._generation:
                self._stranger(identity)
            else:  # never said hello (or was rejected): junk, counted
                self.junk_frames += 1
            return
        peer.last_seen = time.monotonic()
        if isinstance(message, RecordBatch):
            self._records(peer, message.first_seq, len(message.records), message.records)
        elif isinstance(message, Goodbye):
            if message.produced > peer.next_seq:
                missing = message.produced - peer.next_seq  # numbered, never arrived
                peer.dropped += missing
                self._drop(missing, "a worker's queue was full", peer.rank)
            self._end(peer, gone=False, exit_code=message.exit_code)
            # The receipt lets the worker know (and say) whether anything went missing.
            self._sock.reply(identity, codec.encode_ack(Ack(peer.received)))
        elif isinstance(message, UpdateMessage):  # handed to the writer as it comes
            self.events.put(Update(peer.rank, message.kind, message.data))
        elif isinstance(message, Blob):
            if not self.blobs.write(message):
                self.junk_frames += 1
        else:
            self.junk_frames += 1

    def _stranger(self, identity: bytes) -> None:
        """A frame from a stream this (restarted) logger does not know: one the dead logger
        knew. Not junk: it will say hello again, and resend what was not saved."""
        self.stale_frames += 1
        now = time.monotonic()
        if now - self._asked.get(identity, -_REHELLO_PERIOD) >= _REHELLO_PERIOD:
            self._asked[identity] = now
            self._sock.reply(identity, codec.REHELLO_FRAME)
            if os.environ.get("WANDB_FUNNEL_DEBUG_RESTART"):
                log_to_stderr(f"DEBUG rehello to {identity!r}")

    def _hello(self, identity: bytes, hello: Hello) -> None:
        if hello.token != self._token:
            self.rejected_peers += 1
            return
        peer = self._peers.get(identity)
        resume = hello.resume
        if peer is None:
            rank = hello.requested_rank
            # A stream coming back to a restarted logger keeps the rank it had.
            taken = rank in self._used_ranks and (resume is None or self._rank_live(rank))
            if rank is None or taken:
                while self._next_rank in self._used_ranks:
                    self._next_rank += 1
                rank = self._next_rank
            self._used_ranks.add(rank)
            peer = self._peers[identity] = _Peer(
                rank, hello.pid, hello.host, hello.pid_start, time.monotonic()
            )
            self._asked.pop(identity, None)
            if resume is not None:
                self._resumed(peer, resume)
                if os.environ.get("WANDB_FUNNEL_DEBUG_RESTART"):
                    log_to_stderr(f"DEBUG resumed {identity!r} rank {rank} {resume}")
            self.events.put(Attached(rank, hello.pid))
        elif resume is not None:  # asked twice: the second resend repeats the first
            peer.replay_until = max(peer.replay_until, resume[1])
        welcome = Welcome(peer.rank, self.run_info, os.getpid())
        self._sock.reply(identity, codec.encode_welcome(welcome))

    def _rank_live(self, rank: int) -> bool:
        return any(p.rank == rank and not p.ended for p in self._peers.values())

    def _resumed(self, peer: _Peer, resume: tuple[int, int]) -> None:
        """A stream the dead logger knew resends ``[first, until)``: records below what the
        run already has are skipped (received, not written again); records it could no
        longer resend (its replay buffer was full) are counted as dropped."""
        first, until = resume
        saved = self._saved_before.get(peer.rank, 0)
        peer.next_seq = first
        peer.skip_below = saved
        peer.replay_until = until
        if first > saved:
            peer.dropped += first - saved
            self._drop(
                first - saved,
                "a rank's replay buffer was full when the logger was restarted",
                peer.rank,
            )
        # What the run already holds counts as received: the rank's own tally must match.
        peer.received = min(saved, until)

    def _records(
        self, peer: _Peer, first_seq: int, count: int, records: list[Record] | None
    ) -> None:
        """Number a batch of ``count`` records; ``records`` None: skipped for want of room."""
        if first_seq < peer.next_seq:
            if first_seq >= peer.replay_until:
                self.junk_frames += 1  # a replay of numbers already seen
            return  # (or a second resend of a batch this logger has: nothing new)
        end = first_seq + count
        if peer.skip_below > first_seq:  # resent, and the run has these already
            skip = min(count, peer.skip_below - first_seq)
            if records is not None:
                records = records[skip:]
            first_seq, count = first_seq + skip, count - skip
            peer.next_seq = max(peer.next_seq, first_seq)
        if first_seq > peer.next_seq:  # the worker dropped (and counted) these
            peer.dropped += first_seq - peer.next_seq
            self._drop(first_seq - peer.next_seq, "a worker's queue was full", peer.rank)
        peer.next_seq = end
        if not count:
            return  # a heartbeat
        if records is None or not self._reserve(count):
            peer.dropped += count
            self._drop(count, "the logger's queue is full: wandb is slower than the workers")
            self.events.put(Records(peer.rank, [], end))  # its numbers are done with
            return
        peer.received += count
        replayed = first_seq < peer.replay_until
        if replayed:
            self.replayed += count
        self.events.put(Records(peer.rank, records, end, replayed))

    def _reserve(self, count: int) -> bool:
        """Take room for ``count`` records; False when the writer is that far behind."""
        with self._room:
            if self._queued + count > self._max_queued:
                return False
            self._queued += count
        return True

    def _end(self, peer: _Peer, gone: bool, exit_code: int = 0) -> None:
        if not peer.ended:
            peer.ended = True
            self.events.put(Ended(peer.rank, gone, exit_code))

    def _drop(self, count: int, why: str, rank: int | None = None) -> None:
        """Count a drop; said at once the first time for ``why``, then in periodic totals (a
        writer far behind drops every batch, and 1,024 ranks may each drop: a line each
        would flood stderr). The logger's last line gives the run's total."""
        self.dropped += count
        if why not in self._unreported:
            of_rank = f"rank {rank}: " if rank is not None else ""
            log_to_stderr(f"{count} records dropped ({of_rank}{why})")
            self._unreported[why] = 0
        else:
            self._unreported[why] += count

    def _report_drops(self) -> None:
        for why, count in self._unreported.items():
            if count:
                log_to_stderr(f"{count} more records dropped ({why})")
                self._unreported[why] = 0

    def _check_liveness(self) -> None:
        refused = self._sock.handshake_failures()
        if refused:
            self.auth_failures += refused
            log_to_stderr(f"refused {refused} connection(s) without the job's keys")
        for peer in list(self._peers.values()):
            if peer.ended:
                continue
            quiet = self._caught_up_at - peer.last_seen
            if peer.host == self._host:
                gone = quiet >= _GONE_QUIET and not pid_alive(peer.pid, peer.pid_start)
            else:  # its pid means nothing here: its heartbeats stopped
                gone = quiet >= REMOTE_SILENCE
            if gone:
                peer.gone = True
                self.dead_ranks.append(peer.rank)
                self._end(peer, gone=True)
                log_to_stderr(
                    f"rank {peer.rank} (pid {peer.pid}) died without finishing; "
                    f"records it had not yet sent are lost"
                )
