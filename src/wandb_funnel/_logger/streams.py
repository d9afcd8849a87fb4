"""The streams the logger knows (one per rank of one process): their ranks, and the numbering
of their records, the logger's side of the wire's exactly-once rule.

Every record a rank sends has a sequence number; a batch says its first. The receiver takes
each stream's numbers in order: a gap is records the rank dropped itself (counted by it, and
here), a number seen before is a repeat. After a logger's restart a stream says hello again
with what it resends (``[first, until)``): what lies below the run's saved point for that
rank is skipped here (received, never written twice: ``Journal`` holds the rest of the
rule), and what it could no longer resend is counted as dropped.

Pure logic, no socket, no queue, no clock read (``tests/test_streams.py``); the receiver's
thread is its only caller.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from wandb_funnel._constants import REMOTE_SILENCE
from wandb_funnel._pid import pid_alive
from wandb_funnel._protocol.messages import Hello

_GONE_QUIET = 1.0  # seconds of an empty socket after a local rank's last frame: see gone()


@dataclass(slots=True)
class Peer:
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
    # Asked to resend (a node's pre-reduced batches of it were refused): until its hello
    # says what it resends, its frames are not numbered (they would skip what it resends).
    resending: bool = False


class Numbered(NamedTuple):
    """A batch of ``count`` records from ``first_seq``, as the stream's numbering takes it."""

    new: bool  # False: numbers seen before (nothing to take)
    junk: bool  # a repeat of numbers that were never resent: a broken peer
    skip: int  # leading records the run has already (resent after a restart)
    gap: int  # records before these the rank numbered and never sent (it dropped them)
    end: int  # one past the batch's last number
    replayed: bool  # resent to this logger after a restart


class Streams:
    """Every stream by its socket identity. Not thread-safe: the receiver's thread writes,
    others read snapshots (``list(peers.values())``)."""

    def __init__(
        self,
        first_auto_rank: int,
        saved: dict[int, int] | None = None,
        used_ranks: set[int] | None = None,
    ) -> None:
        self.peers: dict[bytes, Peer] = {}
        self.resending: set[bytes] = set()  # streams asked to resend, not yet resending
        self.used_ranks: set[int] = set(used_ranks or ())
        # A restarted logger: every rank's records below saved[rank] are in the run already.
        self._saved_before = dict(saved or {})
        # Ranks the logger assigns start here: 1 after the owner's 0, or the world size in a
        # launched job, so a DataLoader worker never takes a rank a launcher rank will claim.
        self._next_rank = first_auto_rank

    def hello(self, identity: bytes, hello: Hello, now: float) -> tuple[Peer, bool, int]:
        """A stream's hello: (its peer, whether it is new, records it can no longer resend).
        A stream coming back to a restarted logger keeps the rank it had."""
        peer = self.peers.get(identity)
        resume = hello.resume
        if peer is not None:
            if resume is not None:  # asked twice: the second resend repeats the first
                peer.replay_until = max(peer.replay_until, resume[1])
                peer.resending = False
                self.resending.discard(identity)
            return peer, False, 0
        rank = hello.requested_rank
        taken = rank in self.used_ranks and (resume is None or self._rank_live(rank))
        if rank is None or taken:
            while self._next_rank in self.used_ranks:
                self._next_rank += 1
            rank = self._next_rank
        self.used_ranks.add(rank)
        peer = self.peers[identity] = Peer(rank, hello.pid, hello.host, hello.pid_start, now)
        lost = self._resumed(peer, resume) if resume is not None else 0
        return peer, True, lost

    def resend(self, identity: bytes) -> None:
        """``identity`` is asked to resend what is not saved: its batches and goodbye wait
        for its hello (``resending`` until then: asked again until it answers or ends)."""
        peer = self.peers.get(identity)
        if peer is not None and not peer.ended:
            peer.resending = True
            self.resending.add(identity)

    def still_resending(self) -> list[bytes]:
        """The streams asked to resend that have not begun to (and have not ended)."""
        for identity in list(self.resending):
            peer = self.peers.get(identity)
            if peer is None or peer.ended or not peer.resending:
                self.resending.discard(identity)
        return list(self.resending)

    def _rank_live(self, rank: int) -> bool:
        return any(p.rank == rank and not p.ended for p in self.peers.values())

    def _resumed(self, peer: Peer, resume: tuple[int, int]) -> int:
        """A stream the dead logger knew resends ``[first, until)``: records below what the
        run already has are skipped (received, not written again); returns how many it could
        no longer resend (its replay buffer was full), counted as dropped."""
        first, until = resume
        saved = self._saved_before.get(peer.rank, 0)
        peer.next_seq = first
        peer.skip_below = saved
        peer.replay_until = until
        lost = max(0, first - saved)
        peer.dropped += lost
        # What the run already holds counts as received: the rank's own tally must match.
        peer.received = min(saved, until)
        return lost

    @staticmethod
    def number(peer: Peer, first_seq: int, count: int) -> Numbered:
        """Take a batch's numbers in the stream's order (the caller counts ``gap`` and
        ``skip``, and takes records ``[skip:]``)."""
        if first_seq < peer.next_seq:
            junk = first_seq >= peer.replay_until  # a replay of numbers already seen
            return Numbered(False, junk, 0, 0, peer.next_seq, False)
        end = first_seq + count
        skip = 0
        if peer.skip_below > first_seq:  # resent, and the run has these already
            skip = min(count, peer.skip_below - first_seq)
            first_seq += skip
            peer.next_seq = max(peer.next_seq, first_seq)
        gap = first_seq - peer.next_seq  # the worker dropped (and counted) these
        peer.dropped += gap
        peer.next_seq = end
        return Numbered(True, False, skip, gap, end, first_seq < peer.replay_until)

    def gone(
        self, caught_up_at: float, host: str, alive: Callable[[int, int | None], bool] = pid_alive
    ) -> list[Peer]:
        """Streams found dead since the last look (marked so). A rank on this host is dead
        once its pid is, but only once the socket was found empty ``_GONE_QUIET`` after its
        last frame (a rank that exited right after a burst may have thousands of frames
        still queued, and a backlog is not a death); one elsewhere once its heartbeats
        stopped (its pid means nothing here)."""
        found = []
        for peer in list(self.peers.values()):
            if peer.ended:
                continue
            quiet = caught_up_at - peer.last_seen
            if peer.host == host:
                gone = quiet >= _GONE_QUIET and not alive(peer.pid, peer.pid_start)
            else:
                gone = quiet >= REMOTE_SILENCE
            if gone:
                peer.gone = True
                found.append(peer)
        return found

    def snapshot(self) -> list[dict[str, Any]]:
        """Every stream as plain data (``wandb-funnel status``; safe from another thread)."""
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
            for p in list(self.peers.values())
        ]

    def items(self) -> list[tuple[bytes, Peer]]:
        """(identity, peer) of every stream (safe from another thread: a snapshot)."""
        return list(self.peers.items())

    def received(self) -> int:
        """Records taken in from every stream so far (safe from another thread)."""
        return sum(p.received for p in list(self.peers.values()))

    def unfinished(self) -> list[tuple[int, int]]:
        """(rank, pid) of every stream that has neither said goodbye nor died."""
        return [(p.rank, p.pid) for p in list(self.peers.values()) if not p.ended]
