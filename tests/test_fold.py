"""``_node/fold.py`` and ``_logger/folded.py``: a node logger's pre-reduction (issue 38), in
one process with no sockets. A rank's step is folded whole and once; whatever no state
reduces rides along as the rank's part; the root's rows equal the flat funnel's; a frame whose
numbers are not the stream's next is refused whole."""

from __future__ import annotations

import math
from typing import Any

from wandb_funnel._logger import folded
from wandb_funnel._logger.events import EventQueue, FoldedRecords
from wandb_funnel._logger.ordering import Row
from wandb_funnel._logger.receiver import Receiver
from wandb_funnel._logger.reduce import RowBuilder
from wandb_funnel._logger.say import Drops
from wandb_funnel._logger.streams import Streams
from wandb_funnel._node.fold import HOLD_FOR, Folder
from wandb_funnel._protocol import codec, columns
from wandb_funnel._protocol.mergeable import KeyState
from wandb_funnel._protocol.messages import Folded, Hello, NodePlan, Update, UpdateKind
from wandb_funnel._protocol.sockets import LoggerSocket

REDUCE = {"peak": "max", "t": "spread"}


def _batch(seq: int, *records: tuple[int, bool, dict[str, Any]]) -> bytes:
    return codec.encode_batch(seq, [codec.encode_record(s, c, d, 1 << 20) for s, c, d in records])


def _folder(*ranks: int) -> Folder:
    folder = Folder(1 << 20)
    folder.plan(NodePlan(True, REDUCE))
    for rank in ranks:
        folder.welcome(bytes([rank]), rank)
    return folder


def _decode(message: list[bytes]) -> Any:
    return codec.decode(message[-1], 1 << 20)


def _states(frame: Folded) -> list[dict[str, KeyState]]:
    """Each step's states in ``frame``, as the root reads them."""
    keysets = [tuple(keys) for keys in frame.keysets]
    which = [step[3] for step in frame.steps if step[3] >= 0]
    return [columns.states([b]) for b in columns.unpack(keysets, which, frame.states)]


def test_a_step_is_folded_once_the_rank_has_left_it_and_rows_equal_the_flat_funnels() -> None:
    folder = _folder(2, 3)
    sent: list[list[bytes]] = []
    data: dict[int, list[dict[str, Any]]] = {
        2: [{"loss": 1.5, "peak": 3, "t": 0.1}, {"loss": math.nan, "peak": 4, "s": "x"}],
        3: [{"loss": 2.5, "peak": 9, "t": 0.7}, {"loss": 0.25, "peak": 1, "s": "y"}],
    }
    for rank in (2, 3):  # the first batch goes as it came: the node learns the numbering
        sent += folder.records(bytes([rank]), _batch(0, (0, True, {"warm": 1})), 0.0)
    assert [len(m) for m in sent] == [2, 2]
    for step in (1, 2):
        for rank in (2, 3):
            # explicit steps: each stays open until the next batch
            batch = _batch(step, (step, False, data[rank][step - 1]))
            assert folder.records(bytes([rank]), batch, 0.1 * step) == []
    out = folder.tick(1.0)
    (message,) = out
    frame = _decode(message)
    assert isinstance(frame, Folded)
    # step 1 is closed for both ranks (step 2 came); step 2 is still open: held
    assert [entry[1:] for entry in frame.streams] == [[1, 2, 1, 2], [1, 2, 1, 2]]
    assert [step[0] for step in frame.steps] == [1]
    _, committed, records, keyset, parts = frame.steps[0]
    assert (committed, records, sorted(frame.keysets[keyset])) == (False, 2, ["loss", "peak"])
    assert sorted((rank, sorted(part)) for rank, part in parts) == [(2, ["t"]), (3, ["t"])]
    for rank in (2, 3):  # goodbye: every held step folds, and goes before the goodbye
        (last,) = folder.goodbye(bytes([rank]))
        assert [s[0] for s in _decode(last).steps] == [2]
        assert _decode(last).nonfinite == (1 if rank == 2 else 0)

    # the root: rows built from the states equal the flat funnel's from every rank's values
    streams = Streams(first_auto_rank=0)
    for rank in (2, 3):
        peer, _, _ = streams.hello(bytes([rank]), Hello("t", 1, "h", rank, None), 0.0)
        peer.next_seq = 1
    taken = folded.admit(streams, frame)
    assert not isinstance(taken, str)
    _, event = taken
    row = Row(1)
    _, _, records, block, parts = event.steps[0]
    row.add_states(block, parts, records, False)
    flat = Row(1)
    for rank in (2, 3):
        flat.add(rank, dict(data[rank][0]), False)
    assert RowBuilder("auto", REDUCE, "global_step").build(row) == RowBuilder(
        "auto", REDUCE, "global_step"
    ).build(flat)


def test_a_batch_after_its_step_went_as_it_came_goes_so_too() -> None:
    """A held batch whose step stays open past HOLD_FOR goes as it came; a later record of
    the same step must too, or the rank's step would reach the root both ways."""
    folder = _folder(5)
    ident = bytes([5])
    folder.records(ident, _batch(0, (0, True, {"a": 1})), 0.0)
    assert folder.records(ident, _batch(1, (1, False, {"a": 2.0})), 0.0) == []
    out = folder.tick(HOLD_FOR + 1)
    assert out == [[ident, _batch(1, (1, False, {"a": 2.0}))]]
    late = _batch(2, (1, False, {"b": 3.0}))
    assert folder.records(ident, late, HOLD_FOR + 1) == [[ident, late]]
    assert folder.folded == 0


def test_a_resend_after_a_restart_and_a_gap_go_as_they_came() -> None:
    folder = _folder(1)
    ident = bytes([1])
    folder.records(ident, _batch(0, (0, True, {"a": 1})), 0.0)
    assert folder.records(ident, _batch(1, (1, True, {"a": 1})), 0.0) == []
    assert folder.hello(ident, (0, 2)) == []  # its held batch is forgotten: it resends it
    resent = _batch(1, (1, True, {"a": 1}))
    assert folder.records(ident, resent, 0.0) == [[ident, resent]]
    gap = _batch(5, (2, True, {"a": 1}))
    assert folder.records(ident, gap, 0.0) == [[ident, gap]]
    assert folder.tick(10.0) == [] and folder.folded == 0


def test_the_root_refuses_a_folded_frame_whose_numbers_are_not_the_streams_next() -> None:
    streams = Streams(first_auto_rank=0)
    peer, _, _ = streams.hello(b"s", Hello("t", 1, "h", 4, None), 0.0)
    peer.next_seq = 3
    states = columns.pack([columns.state_row(KeyState(4, 1.0))])
    events = EventQueue(1000)

    def frame(first: int, end: int) -> Folded:
        steps = [[7, True, end - first, 0, []]]
        return Folded([[b"s", first, end, 7, 8]], steps, 0, [], [["a"]], states)

    assert "not its next" in (folded.take(streams, events, Drops(), frame(2, 3)) or "")
    stranger = Folded([[b"x", 0, 1, 0, 0]], [], 0, [], [], b"")
    assert "does not know" in (folded.admit(streams, stranger) or "")
    assert peer.next_seq == 3 and peer.received == 0  # nothing taken
    assert folded.take(streams, events, Drops(), frame(3, 4)) is None
    assert peer.next_seq == 4 and peer.received == 1
    events.flush()
    (event,) = events.get(0.1)
    assert isinstance(event, FoldedRecords) and event.records == 1


def test_a_key_of_numbers_and_not_numbers_at_one_step_is_taken_and_reduced_as_flat() -> None:
    """rank 2 logs a float, rank 3 None, for one key at one step: the state and the part
    meet at the root, which takes the frame (it must not refuse it, and ask for it again)."""
    folder = _folder(2, 3)
    for rank, value in ((2, 1.5), (3, None)):
        ident = bytes([rank])
        folder.records(ident, _batch(0, (0, True, {"w": 0})), 0.0)
        folder.records(ident, _batch(1, (1, True, {"loss": value, "n": {"a": 1.0}})), 0.0)
    (message,) = folder.tick(1.0)
    frame = _decode(message)
    streams = Streams(first_auto_rank=0)
    for rank in (2, 3):
        streams.hello(bytes([rank]), Hello("t", 1, "h", rank, None), 0.0)[0].next_seq = 1
    taken = folded.admit(streams, frame)
    assert not isinstance(taken, str), taken
    (step,) = taken[1].steps
    row, flat = Row(1), Row(1)
    row.add_states(step[3], step[4], step[2], True)
    flat.add(2, {"loss": 1.5, "n": {"a": 1.0}})
    flat.add(3, {"loss": None, "n": {"a": 1.0}})
    builder = RowBuilder("auto", {}, "global_step")
    assert builder.build(row) == builder.build(flat) == {"loss": 1.5, "n.a": 1.0}


def test_nested_dicts_of_one_rank_at_one_step_merge_as_flat() -> None:
    """A later record's nested dict replaces the earlier one whole (as ``Row.add``), and is
    flattened after: no stray ``a.c``."""
    folder = _folder(4)
    ident = bytes([4])
    folder.records(ident, _batch(0, (0, True, {"w": 0})), 0.0)
    batch = _batch(1, (1, False, {"a": {"b": 1.0, "c": 2.0}}), (1, True, {"a": {"b": 3.0}}))
    folder.records(ident, batch, 0.0)
    (message,) = folder.tick(1.0)
    (states,) = _states(_decode(message))
    assert sorted(states) == ["a.b"] and states["a.b"].first == 3.0


def test_a_successors_stream_resending_is_never_folded() -> None:
    """A successor node logger knows no stream: a hello's ``resume`` still marks what is
    resent, which goes as it came even once the Welcome names the rank."""
    folder = Folder(1 << 20)
    folder.plan(NodePlan(True, {}))
    ident = bytes([7])
    assert folder.hello(ident, (0, 5)) == []
    first = _batch(0, (0, True, {"a": 1.0}))
    assert folder.records(ident, first, 0.0) == [[ident, first]]
    folder.welcome(ident, 7)
    for seq in range(1, 5):
        resent = _batch(seq, (seq, True, {"a": 1.0}))
        assert folder.records(ident, resent, 0.0) == [[ident, resent]]
    fresh = _batch(5, (5, True, {"a": 1.0}))
    assert folder.records(ident, fresh, 0.0) == []  # held: folded at the next tick
    assert len(folder.tick(1.0)) == 1 and folder.folded == 1


def test_a_leaving_node_logger_sends_what_it_holds_as_it_came() -> None:
    folder = _folder(6)
    ident = bytes([6])
    folder.records(ident, _batch(0, (0, True, {"w": 0})), 0.0)
    held = _batch(1, (1, False, {"a": 1.0}))
    assert folder.records(ident, held, 0.0) == []
    assert folder.leaving() == [[ident, held]]
    assert folder.tick(10.0) == []


def test_a_folded_frame_stays_within_its_budget_and_a_big_batch_goes_as_it_came() -> None:
    folder = Folder(64 * 1024)  # a budget of 16 KiB
    folder.plan(NodePlan(True, {}))
    keys = {f"k{i}": float(i) for i in range(20)}
    for rank in range(16):  # 16 ranks x 4 steps x 20 keys: about 130 KB of states
        ident = bytes([rank])
        folder.welcome(ident, rank)
        folder.records(ident, _batch(0, (0, True, {"w": 0})), 0.0)
        folder.records(ident, _batch(1, *((s, True, keys) for s in range(1, 5))), 0.0)
    big = _batch(5, (5, True, {"s": "x" * 20_000}))
    assert folder.records(bytes([0]), big, 0.0) == []  # held; too big to fold
    out = folder.tick(1.0)
    frames = [m[-1] for m in out if len(m) == 1]
    assert len(frames) > 1 and all(len(f) <= 16 * 1024 for f in frames)
    assert [bytes([0]), big] in out
    assert sum(len(_decode([f]).streams) for f in frames) == 16


def test_a_refused_streams_frames_wait_for_its_hello_and_its_resend_is_taken(
    tmp_path: Any,
) -> None:
    """The root refuses a Folded: the streams it names are asked to resend, and until their
    hello says what they resend, their frames are not numbered (a raw batch after the refused
    numbers would have them counted as skipped, and the resend ignored)."""
    sock = LoggerSocket(f"ipc://{tmp_path}/r.sock", 100, 1 << 20)
    try:
        rx = Receiver(sock, "t", 1 << 20, 1000)
        rx._handle(b"s", Hello("t", 1, "h", 3, None))
        peer = rx.streams.peers[b"s"]
        # not its next numbers
        rx._handle(b"n", Folded([[b"s", 2, 3, 0, 1]], [], 0, [], [], b""))
        assert peer.resending and rx.refused_folded == 1
        rx._handle(b"s", codec.decode(_batch(3, (3, True, {"a": 1.0})), 1 << 20))
        assert (peer.next_seq, peer.received, peer.dropped) == (0, 0, 0)
        # with no room for records it is not counted as dropped from its header either
        rx.events.reserve(1000)
        assert not rx._skip_batch(b"s", _batch(3, (3, True, {"a": 1.0})))
        rx.events.taken(1000)
        # what it never resends (an update: config, console, ...) is taken meanwhile
        rx._handle(b"s", Update(UpdateKind.CONFIG, {"lr": 1}))
        rx.events.flush()
        assert [type(e).__name__ for e in rx.events.get(0.1)] == ["Attached", "Update"]
        # asked again (a REHELLO may be lost) until it says hello with what it resends
        assert rx.streams.still_resending() == [b"s"]
        rx._handle(b"s", Hello("t", 1, "h", 3, None, (0, 4)))
        assert not peer.resending and rx.streams.still_resending() == []
        rx._handle(b"s", codec.decode(_batch(0, (0, True, {"a": 1.0})), 1 << 20))
        assert (peer.next_seq, peer.received, peer.dropped) == (1, 1, 0)
    finally:
        sock.close()


def test_the_floor_sent_stays_below_a_batch_that_goes_as_it_came() -> None:
    """A gap (the rank dropped records) sends the next batch as it came, with a step below
    the floor its held batches reached: the Folded before it must not let the root pass it."""
    folder = _folder(8)
    ident = bytes([8])
    folder.records(ident, _batch(0, (0, True, {"w": 0})), 0.0)
    folder.records(ident, _batch(1, (5, False, {"a": 1.0})), 0.0)  # held: step 5 open
    # the rank dropped records 2..8; its next batch closes step 5, and brings steps 6 to 8
    after_gap = _batch(9, (6, False, {"a": 2.0}), (8, True, {"a": 3.0}))
    out = folder.records(ident, after_gap, 0.0)
    assert out[-1] == [ident, after_gap] and len(out) == 2
    (entry,) = _decode(out[0]).streams
    assert entry[1:3] == [1, 2] and entry[4] == 6  # the floor: not 9, past step 6


def test_nested_values_count_in_a_folded_frames_size() -> None:
    folder = Folder(64 * 1024)  # a budget of 16 KiB
    folder.plan(NodePlan(True, {}))
    ident = bytes([1])
    folder.welcome(ident, 1)
    folder.records(ident, _batch(0, (0, True, {"w": 0})), 0.0)
    nested = _batch(1, (1, True, {"g": {f"k{i}": i for i in range(1_500)}}))
    assert len(nested) < 16 * 1024  # small as it came; 1,500 states folded
    folder.records(ident, nested, 0.0)
    assert folder.tick(1.0) == [[ident, nested]]


def test_a_node_logger_folds_once_a_period_as_the_root_said() -> None:
    folder = Folder(1 << 20)
    folder.plan(NodePlan(True, {}, 1.0))
    ident = bytes([1])
    folder.welcome(ident, 1)
    folder.records(ident, _batch(0, (0, True, {"a": 1})), 0.0)
    assert folder.tick(0.0) == []  # nothing held yet; the next is due a period on
    folder.records(ident, _batch(1, (1, True, {"a": 2.0})), 0.1)
    assert folder.tick(0.5) == []  # held, foldable, but not yet due
    (message,) = folder.tick(1.0)
    assert _states(_decode(message))[0]["a"].first == 2.0
