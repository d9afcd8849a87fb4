"""The node tier's parts (issue 38) with real ZeroMQ sockets in one process: a rank's DEALER,
a node logger's two sockets and loop, the root's ROUTER; and the root's view of the nodes.
The whole tier under torchrun is tests/processes/test_nodes.py."""

from __future__ import annotations

import json
import os
import pathlib
import time
from collections.abc import Iterator

import pytest

from wandb_funnel import _private_dir
from wandb_funnel._logger.nodes import Nodes, fold_period
from wandb_funnel._logger.streams import Streams
from wandb_funnel._node.relay import STREAMS_FILE, NodeRelay
from wandb_funnel._protocol import codec, node_wire
from wandb_funnel._protocol.messages import (
    NODE,
    Hello,
    NodeHello,
    NodePlan,
    NodeSaved,
    NodeStart,
    Rehello,
    Saved,
)
from wandb_funnel._protocol.sockets import (
    NODE_PREFIX,
    STREAM_PREFIX,
    ClientSocket,
    LoggerSocket,
    NodeSockets,
)

TOKEN = "tok"


class Tier:
    """A root ROUTER, a node logger between, and ranks' DEALERs on the node's endpoint."""

    def __init__(self, tmp: pathlib.Path, generation: int = 0) -> None:
        self.root = LoggerSocket(f"ipc://{tmp}/root.sock", 1000, 1 << 20)
        self.node_dir = tmp / "node"
        self.node_dir.mkdir(exist_ok=True)
        self.endpoint = f"ipc://{self.node_dir}/{_private_dir.NODE_SOCKET}"
        self.socks = NodeSockets(self.endpoint, f"ipc://{tmp}/root.sock", None, 1 << 20)
        self.relay = NodeRelay(
            self.socks,
            token=TOKEN,
            node=1,
            parent_pid=os.getpid(),
            state_dir=str(self.node_dir),
            generation=generation,
        )
        self.ranks: list[ClientSocket] = []

    def rank(self) -> tuple[ClientSocket, bytes]:
        identity = STREAM_PREFIX + os.urandom(11)
        sock = ClientSocket(self.endpoint, identity, 100)
        self.ranks.append(sock)
        return sock, identity

    def pump(self, seconds: float = 0.3) -> None:
        """The node logger's loop, by hand, for a while."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            local_in, up_in, _ = self.socks.poll(0.02, False)
            if up_in:
                self.relay._from_root()
            if local_in:
                self.relay._from_ranks()

    def root_frames(self) -> list[tuple[bytes, bytes]]:
        out = []
        while (message := self.root.recv_nowait()) is not None:
            identity, frames = message
            out.append((identity, frames[0]))
        return out

    def close(self) -> None:
        for sock in self.ranks:
            sock.close(0)
        self.socks.close(0)
        self.root.close()


@pytest.fixture
def tier(tmp_path: pathlib.Path) -> Iterator[Tier]:
    t = Tier(tmp_path)
    yield t
    t.close()


def _hello(pid: int | None = None) -> bytes:
    return codec.encode_hello(Hello(TOKEN, pid or os.getpid(), "h", None, None))


def test_a_ranks_frames_reach_the_root_as_its_own_and_replies_come_back(tier: Tier) -> None:
    """Through the node logger, the root sees each rank's identity (not the node logger's),
    frames in order; its reply to that identity reaches that rank only."""
    a, a_id = tier.rank()
    b, b_id = tier.rank()
    a.try_send(_hello())
    b.try_send(_hello())
    for seq in range(3):
        a.try_send(codec.encode_batch(seq, []))
    tier.pump()
    got = tier.root_frames()
    assert [i for i, _ in got if i == a_id] == [a_id] * 4
    assert [i for i, _ in got if i == b_id] == [b_id]
    assert [codec.peek_batch(f) for i, f in got if i == a_id][1:] == [(0, 0), (1, 0), (2, 0)]
    tier.root.reply(b_id, codec.REHELLO_FRAME)
    tier.pump()
    assert isinstance(codec.decode(b.recv_within(1.0) or b"", 1 << 10), Rehello)
    assert a.recv_within(0.1) is None
    # the ranks' saved points, in one frame to the node logger: each rank gets its own
    (route,) = set(tier.root.routes.values())
    tier.root.reply(route, node_wire.encode_node_saved(NodeSaved([[a_id, 3], [b_id, 0]])))
    tier.pump()
    assert codec.decode(a.recv_within(1.0) or b"", 1 << 10) == Saved(3)
    assert codec.decode(b.recv_within(1.0) or b"", 1 << 10) == Saved(0)
    assert tier.relay.junk == 0
    # the streams it served are noted for a successor
    streams = json.loads((tier.node_dir / STREAMS_FILE).read_text())
    assert set(streams) == {a_id.hex(), b_id.hex()}


def _node_word(tier: Tier) -> tuple[bytes, bytes]:
    """The node logger says its word now: (the identity it reached the root with, the
    frame). Frames of its ranks still on their way are passed over."""
    tier.relay._beat("live")
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        tier.root.wait(0.1)
        for identity, frame in tier.root_frames():
            if codec.peek_kind(frame) == NODE:
                return identity, frame
    raise AssertionError("the node logger's word did not reach the root")


def test_the_node_logger_says_its_node_to_the_root(tier: Tier) -> None:
    identity, frame = _node_word(tier)
    assert identity.startswith(NODE_PREFIX)  # the node logger's own, not a stream's
    assert codec.peek_kind(frame) == NODE
    assert codec.decode(frame, 1 << 10) == NodeHello(TOKEN, 1, tier.relay._host, os.getpid())


def test_the_node_logger_tells_the_root_what_it_forwarded_and_dropped(tier: Tier) -> None:
    """Its counts reach the root with its next word, and ``status``'s nodes show them."""
    a, _ = tier.rank()
    a.try_send(_hello())
    for seq in range(3):
        a.try_send(codec.encode_batch(seq, []))
    tier.pump()
    tier.relay.junk += 2  # (malformed frames: counted where the relay drops them)
    route, frame = _node_word(tier)
    hello = codec.decode(frame, 1 << 10)
    assert isinstance(hello, NodeHello)
    assert (hello.forwarded, hello.stale, hello.junk) == (4, 0, 2)
    nodes = Nodes(0, Streams(first_auto_rank=1), {}, NodePlan(False, {}))
    assert nodes.seen(route, hello, TOKEN)
    (_, node) = nodes.snapshot(time.monotonic())
    assert (node["forwarded"], node["stale"], node["junk"]) == (4, 0, 2)


def test_a_successor_asks_its_predecessors_streams_to_say_hello_again(
    tmp_path: pathlib.Path,
) -> None:
    """A restarted node logger: every stream its predecessor noted is sent REHELLO until it
    says hello; a frame from a stream it does not know is answered with REHELLO and never
    forwarded (the rank resends it, and the root, which took what it had, skips repeats)."""
    first = Tier(tmp_path)
    rank, identity = first.rank()
    rank.try_send(_hello())
    first.pump()
    first.root_frames()
    first.socks.close(0)  # the node logger dies; the rank's socket stays
    first.root.close()
    try:
        second = Tier(tmp_path, generation=1)
        try:
            reply = None
            deadline = time.monotonic() + 5
            while reply is None and time.monotonic() < deadline:  # as its loop does
                second.relay._ask_again(time.monotonic())  # (the rank reconnects meanwhile)
                reply = rank.recv_within(0.2)
            assert isinstance(codec.decode(reply or b"", 1 << 10), Rehello)
            rank.try_send(codec.encode_batch(5, []))  # a frame sent before it heard
            second.pump()
            assert second.root_frames() == []
            assert second.relay.stale == 1
            rank.try_send(_hello())
            second.pump()
            assert [i for i, _ in second.root_frames()] == [identity]
            assert second.relay._ask == {}
        finally:
            second.close()
    finally:
        rank.close(0)


def test_the_root_knows_each_node_its_logger_and_its_ranks() -> None:
    streams = Streams(first_auto_rank=4)
    routes: dict[bytes, bytes] = {}
    nodes = Nodes(0, streams, routes, NodePlan(False, {}))
    now = time.monotonic()
    for rank in range(4):
        identity = bytes([1, rank])
        streams.hello(identity, Hello(TOKEN, 100 + rank, "h", rank, None), now)
        if rank >= 2:
            routes[identity] = b"\x03node1"
    assert not nodes.seen(b"\x03node1", NodeHello("wrong", 1, "h1", 77), TOKEN)
    assert nodes.seen(b"\x03node1", NodeHello(TOKEN, 1, "h1", 77), TOKEN)
    snap = nodes.snapshot(time.monotonic())
    assert [(n["node"], n["ranks"], n["state"]) for n in snap] == [
        (0, [0, 1], "live"),
        (1, [2, 3], "live"),
    ]
    assert snap[0]["logger_pid"] == os.getpid() and snap[1]["logger_pid"] == 77
    assert nodes.count() == 2
    # silent past REMOTE_SILENCE: gone; a successor (a new route, a new pid): a restart
    assert nodes.snapshot(time.monotonic() + 60)[1]["state"] == "gone"
    assert nodes.seen(b"\x03node1-again", NodeHello(TOKEN, 1, "h1", 78), TOKEN)
    for identity in (bytes([1, 2]), bytes([1, 3])):
        routes[identity] = b"\x03node1-again"
    (_, second) = nodes.snapshot(time.monotonic())
    assert (second["logger_pid"], second["restarts"], second["ranks"]) == (78, 1, [2, 3])
    assert nodes.count() == 2


def test_a_node_loggers_directory_is_never_taken_for_the_loggers() -> None:
    """A rank attached through its node logger stages media as bytes (the logger is on
    another node): the node logger's directory is not the logger's."""
    assert _private_dir.of_address("ipc:///tmp/d/logger.sock") == "/tmp/d"
    assert _private_dir.of_address(f"ipc:///tmp/d/{_private_dir.NODE_SOCKET}") is None


def test_node_messages_refuse_malformed_input() -> None:
    for bad in (
        node_wire.encode_node_hello(NodeHello(TOKEN, -1, "h", 1)),
        node_wire.encode_node_hello(NodeHello(TOKEN, 1, "h", 1, "dancing")),
        node_wire.encode_node_hello(NodeHello(TOKEN, 1, "h", 1, "live", -1)),
    ):
        with pytest.raises(codec.DecodeError):
            codec.decode(bad, 1 << 10)
    assert codec.peek_kind(b"\xc1") is None
    start = NodeStart("ipc:///a", "/a", "tcp://h:1", None, TOKEN, 1, 2, 3)
    assert NodeStart.from_json(start.to_json()) == start
    with pytest.raises(ValueError, match="node logger start message"):
        NodeStart.from_json(b'{"endpoint": "x"}')


def test_status_shows_each_node_with_its_logger_and_ranks() -> None:
    from wandb_funnel import _status

    funnel: dict[str, object] = dict.fromkeys(_status.FUNNEL_KEYS)
    funnel.update(run_id="r", owner_pid=1, started=0, state="running", rows=3)
    funnel.update(pending_rows=0, dropped=0, ranks=[])
    funnel["nodes"] = [
        {"node": 0, "host": "a", "logger_pid": 10, "ranks": [0, 1], "state": "live"},
        {"node": 1, "host": "b", "logger_pid": 77, "ranks": [2, 3], "state": "gone"},
    ]
    funnel["nodes"][1].update(restarts=1, forwarded=40, stale=3, junk=0)  # type: ignore[index]
    screen = _status.render([funnel])
    assert "node 0 on a: logger pid 10, live, ranks [0, 1], restarts 0, forwarded 0" in screen
    assert (
        "node 1 on b: logger pid 77, gone, ranks [2, 3], restarts 1, forwarded 40, stale 3, "
        "junk 0" in screen
    )
    funnel["nodes"] = None  # flat: no node lines
    assert "node " not in _status.render([funnel])


def test_node_loggers_fold_less_often_as_the_job_grows_and_are_told_so() -> None:
    """The root's plan: told on a node logger's first hello, again while it has folded
    nothing, and again when the job has grown enough nodes that its period should be
    longer (the root's cost is per frame); not at every hello."""
    nodes = Nodes(0, Streams(first_auto_rank=0), {}, NodePlan(True, {"x": "max"}))

    def hello(route: bytes, folded: int) -> NodePlan | None:
        new = nodes.new(route)
        node = int.from_bytes(route[1:], "big")
        assert nodes.seen(route, NodeHello(TOKEN, node, "h", 1, folded=folded), TOKEN)
        return nodes.plan(route, new, NodeHello(TOKEN, node, "h", 1, folded=folded))

    first = b"\x03" + (1).to_bytes(2, "big")
    assert hello(first, 0) == NodePlan(True, {"x": "max"}, 0.2)
    assert hello(first, 0) == NodePlan(True, {"x": "max"}, 0.2)  # (it may not have heard)
    assert hello(first, 5) is None
    for node in range(2, 2049):
        hello(b"\x03" + node.to_bytes(2, "big"), 5)
    assert fold_period(2048) == 1.0
    assert hello(first, 9) == NodePlan(True, {"x": "max"}, 1.0)
    assert hello(first, 12) is None
