"""``_logger/saved_replies.py``: ranks are told their saved points at most ``RATE`` a second
in all, except a rank that said goodbye, which is told at once (it waits for it at exit)."""

from __future__ import annotations

from typing import Any

from wandb_funnel._logger.saved_replies import RATE, SavedReplies
from wandb_funnel._protocol import codec
from wandb_funnel._protocol.messages import NodeSaved, Saved


class _Peer:
    def __init__(self, rank: int) -> None:
        self.rank = rank


class _Sock:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes, Any]] = []
        self.routes: dict[bytes, bytes] = {}  # a stream forwarded by a node logger -> it

    def reply(self, identity: bytes, frame: bytes) -> None:
        self.sent.append((identity, codec.decode(frame, 1 << 10)))


def test_saved_points_go_at_most_rate_a_second_and_an_ending_rank_s_at_once() -> None:
    ranks = 2 * RATE  # two seconds' worth of messages
    peers = {bytes([1]) + r.to_bytes(4, "big"): _Peer(r) for r in range(ranks)}
    sock = _Sock()
    saved = SavedReplies(sock, peers)  # type: ignore[arg-type]
    saved.post(dict.fromkeys(range(ranks), 5))
    saved.send(0.0)
    assert len(sock.sent) == ranks and all(m == Saved(5) for _, m in sock.sent)
    sock.sent.clear()
    saved.post(dict.fromkeys(range(ranks), 9))
    saved.send(1.0)  # not due before 2.0: nothing, the points wait (the latest kept)
    assert sock.sent == []
    last = bytes([1]) + (7).to_bytes(4, "big")
    saved.ending(7, last)
    saved.post({7: 11})
    saved.send(1.5)  # rank 7 said goodbye: told at once, and only it
    assert sock.sent == [(last, Saved(11))]
    sock.sent.clear()
    saved.send(2.0)
    assert len(sock.sent) == ranks - 1 and {m for _, m in sock.sent} == {Saved(9)}
    assert last not in {identity for identity, _ in sock.sent}


def test_a_small_job_s_ranks_are_told_at_every_flush() -> None:
    peers = {bytes([r]): _Peer(r) for r in range(4)}
    sock = _Sock()
    saved = SavedReplies(sock, peers)  # type: ignore[arg-type]
    for t, point in enumerate((3, 4, 5)):
        saved.post(dict.fromkeys(range(4), point))
        saved.send(t * 0.01)  # 10 ms apart: 4 messages need 1 ms at RATE
        assert [m for _, m in sock.sent[-4:]] == [Saved(point)] * 4


def test_the_ranks_behind_a_node_logger_are_told_in_one_frame_to_it() -> None:
    peers = {bytes([1, r]): _Peer(r) for r in range(6)}
    sock = _Sock()
    sock.routes = {bytes([1, r]): b"\x03node-a" if r < 4 else b"\x03node-b" for r in range(1, 6)}
    saved = SavedReplies(sock, peers)  # type: ignore[arg-type]
    saved.post({r: 10 + r for r in range(6)})
    saved.send(0.0)
    assert sorted(sock.sent, key=repr) == sorted(
        [
            (bytes([1, 0]), Saved(10)),  # rank 0: the root's own node, told directly
            (b"\x03node-a", NodeSaved([[bytes([1, r]), 10 + r] for r in (1, 2, 3)])),
            (b"\x03node-b", NodeSaved([[bytes([1, 4]), 14], [bytes([1, 5]), 15]])),
        ],
        key=repr,
    )


def test_a_point_held_by_the_rate_goes_at_once_when_its_rank_says_goodbye() -> None:
    """Its last point was posted just before its goodbye, and held back by the rate: no
    newer one will come, and the rank waits for it at exit (found in review)."""
    ranks = 2 * RATE
    peers = {r.to_bytes(4, "big"): _Peer(r) for r in range(ranks)}
    sock = _Sock()
    saved = SavedReplies(sock, peers)  # type: ignore[arg-type]
    saved.post(dict.fromkeys(range(ranks), 1))
    saved.send(0.0)  # a pass over every rank: the next is not due before 2.0
    sock.sent.clear()
    saved.post({7: 9})
    saved.send(0.1)
    assert sock.sent == []  # held by the rate
    saved.ending(7, (7).to_bytes(4, "big"))
    saved.send(0.2)
    assert sock.sent == [((7).to_bytes(4, "big"), Saved(9))]
