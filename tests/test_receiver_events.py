"""The receiver hands the writer what one drain took as one list, in the order it took it:
one wake of the writer for many frames (issue 38), never a reordering. A socket stand-in
feeds real frames, so the drain is exact; no threads, no sleeps."""

from __future__ import annotations

import os
import queue

import pytest

from wandb_funnel._logger.events import Attached, Ended, FoldedRecords, Records
from wandb_funnel._logger.receiver import Receiver
from wandb_funnel._protocol import codec
from wandb_funnel._protocol.messages import Goodbye, Hello

pytestmark = pytest.mark.timeout(30)

TOKEN = "t" * 32


class _Frames:
    """What the receiver uses of its socket: frames queued up front, replies kept."""

    def __init__(self, frames: list[tuple[bytes, bytes]]) -> None:
        self._frames = list(frames)
        self.routes: dict[bytes, bytes] = {}
        self.replies: list[tuple[bytes, bytes]] = []

    def recv_nowait(self) -> tuple[bytes, list[bytes]] | None:
        if not self._frames:
            return None
        identity, frame = self._frames.pop(0)
        return identity, [frame]

    def reply(self, identity: bytes, frame: bytes) -> None:
        self.replies.append((identity, frame))


def _stream(identity: bytes, rank: int, steps: range) -> list[tuple[bytes, bytes]]:
    hello = Hello(TOKEN, os.getpid(), "host", rank)
    frames = [(identity, codec.encode_hello(hello))]
    for seq, step in enumerate(steps):
        record = codec.encode_record(step, True, {"loss": float(step), "rank": rank}, 1 << 16)
        frames.append((identity, codec.encode_batch(seq, [record])))
    frames.append((identity, codec.encode_goodbye(Goodbye(len(steps), "done"))))
    return frames


def test_one_drain_is_one_list_of_events_in_the_order_taken() -> None:
    a, b = _stream(b"\x01a", 1, range(5)), _stream(b"\x01b", 2, range(3))
    pairs = zip(a[1:], b[1 : len(a)], strict=False)  # b is the shorter: a's tail follows
    interleaved = [a[0], b[0], *[f for pair in pairs for f in pair], *a[len(b) :]]
    receiver = Receiver(_Frames(interleaved), TOKEN, 1 << 20, 10_000)  # type: ignore[arg-type]

    assert receiver._drain(1_000) is True  # the socket ran empty
    assert receiver.events.empty()  # nothing handed over before the drain's end ...
    receiver.events.flush()
    events = receiver.events.get(0.0)  # ... then all of it, as one list
    with pytest.raises(queue.Empty):
        receiver.events.get(0.0)

    by_rank: dict[int, list[object]] = {1: [], 2: []}
    for event in events:
        assert not isinstance(event, FoldedRecords)  # (no node logger here)
        by_rank[event.rank].append(event)
    for rank, steps in ((1, 5), (2, 3)):
        kinds = [type(e) for e in by_rank[rank]]
        assert kinds == [Attached, *[Records] * steps, Ended], (rank, kinds)
        taken = [r.records[0][0] for r in by_rank[rank] if isinstance(r, Records)]
        assert taken == list(range(steps))
    # Each rank's events keep the socket's order across the two streams' interleaving.
    assert [type(e) for e in events[:2]] == [Attached, Attached]
    receiver.events.flush()
    assert receiver.events.empty()  # an empty outbox hands over nothing
