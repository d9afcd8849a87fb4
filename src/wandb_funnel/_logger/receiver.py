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
import socket
import threading
import time
from typing import Any

from wandb_funnel._constants import BATCH_RECORDS, EXIT_OWNER_LOST
from wandb_funnel._logger import folded
from wandb_funnel._logger.blobs import BlobWriter
from wandb_funnel._logger.close_request import CloseRequests
from wandb_funnel._logger.events import Attached, Ended, EventQueue, Records, Update
from wandb_funnel._logger.nodes import Nodes
from wandb_funnel._logger.saved_replies import SavedReplies
from wandb_funnel._logger.say import Drops, log_to_stderr
from wandb_funnel._logger.streams import Peer, Streams
from wandb_funnel._protocol import codec, node_wire
from wandb_funnel._protocol.messages import (
    Ack,
    Blob,
    Close,
    Folded,
    Goodbye,
    Hello,
    NodeHello,
    NodePlan,
    Record,
    RecordBatch,
    Welcome,
)
from wandb_funnel._protocol.messages import Update as UpdateMessage
from wandb_funnel._protocol.sockets import LoggerSocket

_TICK = 0.05  # seconds between checks when the socket is quiet
# A receiver that has not seen its socket empty for this long is behind on its input. (Idle,
# it sees it empty every _TICK; keeping up, after every few hundred frames.)
_DRAINED_WITHIN = 0.25
# Caught up, frames trickle in one at a time: a frame that finds this thread caught up waits
# this long for others to gather, so that a drain, and the writer's wake, takes many
# (``EventQueue``; issue 38: about a third less CPU at 1,024 ranks).
_GATHER = 0.002
_LIVENESS_PERIOD = 0.25  # seconds between checks that ranks still live
_DROP_REPORT_PERIOD = 5.0  # seconds between log lines about drops with the same cause
_REHELLO_PERIOD = 0.5  # a stranger's frames get one REHELLO per this many seconds


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
        node: int | None = None,
        plan: NodePlan | None = None,
    ) -> None:
        super().__init__(name="wandb-funnel-receiver", daemon=True)
        self._sock = sock
        self._token = token
        self._max_frame = max_frame
        self.blobs = BlobWriter(staging)  # media bytes from ranks on other nodes
        self._host = socket.gethostname()
        self.streams = Streams(first_auto_rank, saved, used_ranks)
        self._peers = self.streams.peers
        # the node tier's node loggers
        self.nodes = Nodes(node, self.streams, sock.routes, plan or NodePlan(False, {}))
        # A restarted logger (generation > 0): streams it does not know are asked to say
        # hello again.
        self._generation = generation
        self._asked: dict[bytes, float] = {}  # strangers asked to say hello again, and when
        self.stale_frames = 0  # frames of streams the dead logger knew, before their hello
        self.replayed = 0  # records resent to this logger after a restart
        self.saved = SavedReplies(sock, self._peers)  # the writer posts, this thread sends
        self._caught_up_at = 0.0
        self._stopping = threading.Event()
        self.events = EventQueue(max_queued_records)
        self.closer: bytes | None = None
        self.refused_folded = 0  # node loggers' Folded frames refused (resent as they came)
        self.footer = True  # the owner's CLOSE: print wandb's end-of-run footer
        # The owner's CLOSE goes here, out of band of the events: behind a backlog of queued
        # records the writer would see it only after writing them all, past its deadline.
        self.close_requests = close_requests if close_requests is not None else CloseRequests()
        # Accounting (read by the writer once this thread has stopped).
        self.drops = Drops()  # records counted as dropped, said by cause
        self.junk_frames = 0
        self.rejected_peers = 0
        self.auth_failures = 0  # TCP peers refused by the CURVE handshake
        self.dead_ranks: list[int] = []
        self.failure: BaseException | None = None
        # What the open run says about itself, for the ranks' Welcome: set once (one
        # assignment, atomic) by the writer when the run is open; None until then.
        self.run_info: dict[str, Any] | None = None

    # -- the writer's side -------------------------------------------------------------------
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
    def dropped(self) -> int:
        return self.drops.total

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
        finally:
            self.events.flush()  # what it took is received (counted): the writer gets it

    def _serve(self) -> None:
        next_check = 0.0
        next_report = time.monotonic() + _DROP_REPORT_PERIOD
        caught_up = True
        while not self._stopping.is_set():
            if self._sock.wait(_TICK):
                if caught_up:
                    time.sleep(_GATHER)
                caught_up = self._drain(200)
            else:
                caught_up = True
            self.events.flush()  # before it says caught up: what it took is the writer's
            if caught_up:
                self._caught_up_at = time.monotonic()
            now = time.monotonic()
            if now >= next_check:
                next_check = now + _LIVENESS_PERIOD
                self._check_liveness()
            if now >= next_report:
                next_report = now + _DROP_REPORT_PERIOD
                self.drops.report()
            self.events.flush()  # (what liveness found: ranks gone)
            self.saved.send(now)
        # What is already queued (bounded by HWMs), handed over as it is taken: the writer
        # stops waiting for this thread after a while, and takes what was handed by then.
        for _ in range(5_000):
            drained = self._drain(200)
            self.events.flush()
            if drained:
                break
        self.drops.report()

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
            if not self.events.fits(BATCH_RECORDS) and self._skip_batch(identity, frames[0]):
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
        if peer is None or peer.resending or header is None or self.events.fits(header[1]):
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
        if isinstance(message, NodeHello):
            new = self.nodes.new(identity)
            if not self.nodes.seen(identity, message, self._token):
                self.rejected_peers += 1
            elif (node_plan := self.nodes.plan(identity, new, message)) is not None:
                self._sock.reply(identity, node_wire.encode_node_plan(node_plan))
            return
        if isinstance(message, Folded):
            self._folded(identity, message)
            return
        peer = self._peers.get(identity)
        if peer is None or (peer.resending and isinstance(message, RecordBatch | Goodbye)):
            if peer is not None or self._generation:
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
            self.saved.ending(peer.rank, identity)
            # The receipt lets the worker know (and say) whether anything went missing.
            self._sock.reply(identity, codec.encode_ack(Ack(peer.received)))
        elif isinstance(message, UpdateMessage):  # handed to the writer as it comes
            self.events.post(Update(peer.rank, message.kind, message.data))
        elif isinstance(message, Blob):
            if not self.blobs.write(message):
                self.junk_frames += 1
        else:
            self.junk_frames += 1

    def _folded(self, route: bytes, message: Folded) -> None:
        """A node logger's pre-reduced batches: taken whole, or refused and resent."""
        refused = folded.take(self.streams, self.events, self.drops, message)
        if refused is not None:
            self.refused_folded += 1
            log_to_stderr(f"refused a node's pre-reduced batches ({refused}); they are resent")
            for identity, *_ in message.streams:
                self._sock.routes.setdefault(identity, route)
                self.streams.resend(identity)
                self._asked.pop(identity, None)  # asked now, whenever it was asked last
                self._stranger(identity)

    def _stranger(self, identity: bytes) -> None:
        """A frame from a stream this (restarted) logger does not know: one the dead logger
        knew. Not junk: it will say hello again, and resend what was not saved."""
        self.stale_frames += 1
        now = time.monotonic()
        if now - self._asked.get(identity, -_REHELLO_PERIOD) >= _REHELLO_PERIOD:
            self._asked[identity] = now
            self._sock.reply(identity, codec.REHELLO_FRAME)

    def _hello(self, identity: bytes, hello: Hello) -> None:
        if hello.token != self._token:
            self.rejected_peers += 1
            return
        peer, new, lost = self.streams.hello(identity, hello, time.monotonic())
        if new:
            self._asked.pop(identity, None)
            if lost:
                self._drop(
                    lost, "a rank's replay buffer was full when the logger was restarted", peer.rank
                )
            self.events.post(Attached(peer.rank, hello.pid))
        welcome = Welcome(peer.rank, self.run_info, os.getpid())
        self._sock.reply(identity, codec.encode_welcome(welcome))

    def _records(
        self, peer: Peer, first_seq: int, count: int, records: list[Record] | None
    ) -> None:
        """Number a batch of ``count`` records; ``records`` None: skipped for want of room."""
        taken = self.streams.number(peer, first_seq, count)
        if not taken.new:
            self.junk_frames += taken.junk  # (or a second resend of a batch this logger has)
            return
        if taken.gap:
            self._drop(taken.gap, "a worker's queue was full", peer.rank)
        count -= taken.skip
        if not count:
            return  # a heartbeat, or a batch the run has already
        if records is None or not self.events.reserve(count):
            peer.dropped += count
            self._drop(count, "the logger's queue is full: wandb is slower than the workers")
            self.events.post(Records(peer.rank, [], taken.end))  # its numbers are done with
            return
        peer.received += count
        if taken.replayed:
            self.replayed += count
        records = records[taken.skip :] if taken.skip else records
        self.events.post(Records(peer.rank, records, taken.end, taken.replayed))

    def _end(self, peer: Peer, gone: bool, exit_code: int = 0) -> None:
        if not peer.ended:
            peer.ended = True
            self.events.post(Ended(peer.rank, gone, exit_code))

    def _drop(self, count: int, why: str, rank: int | None = None) -> None:
        self.drops.count(count, why, rank)

    def _check_liveness(self) -> None:
        for identity in self.streams.still_resending():  # a REHELLO may be lost: again
            self._stranger(identity)
        refused = self._sock.handshake_failures()
        if refused:
            self.auth_failures += refused
            log_to_stderr(f"refused {refused} connection(s) without the job's keys")
        for peer in self.streams.gone(self._caught_up_at, self._host):
            self.dead_ranks.append(peer.rank)
            self._end(peer, gone=True)
            log_to_stderr(
                f"rank {peer.rank} (pid {peer.pid}) died without finishing; "
                f"records it had not yet sent are lost"
            )
