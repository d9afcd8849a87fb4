"""_worker.replay: the rank's replay buffer, pure; and, through real frames on a fake socket,
against a fake logger that saves, acks and dies: every record in the run once, or counted."""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from wandb_funnel._protocol import codec
from wandb_funnel._protocol.messages import Blob, Hello, RecordBatch, Saved
from wandb_funnel._worker.replay import ReplayBuffer

MAX = 1 << 20


def _kept(buffer: ReplayBuffer) -> list[tuple[int, int]]:
    """(first, count) of each batch held, from the frames themselves."""
    out = []
    for frame in buffer.frames():
        message = codec.decode(frame, MAX)
        assert isinstance(message, RecordBatch)
        out.append((message.first_seq, len(message.records)))
    return out


def _batch(first: int, count: int) -> bytes:
    seqs = range(first, first + count)
    records = [codec.encode_record(seq, True, {"seq": seq}, MAX) for seq in seqs]
    return codec.encode_batch(first, records)


def test_batches_are_kept_until_saved_and_the_resume_range_starts_at_the_oldest() -> None:
    buffer = ReplayBuffer(1000, 1 << 20)
    assert not buffer and buffer.resume(0) == (0, 0)
    buffer.keep(0, 3, _batch(0, 3))
    buffer.keep(3, 2, _batch(3, 2))
    buffer.keep(5, 0, _batch(5, 0))  # a heartbeat: nothing to keep
    assert len(buffer) == 2 and buffer.records == 5
    assert buffer.resume(5) == (0, 5)
    assert buffer.saved(2)  # inside the first batch: the whole batch stays
    assert _kept(buffer) == [(0, 3), (3, 2)] and buffer.unsaved(5) == 3
    assert buffer.saved(3)
    assert _kept(buffer) == [(3, 2)] and buffer.resume(5) == (3, 5)
    assert not buffer.saved(3) and not buffer.saved(1)  # said again, or late: no change
    assert buffer.saved_below == 3
    assert buffer.saved(5)
    assert not buffer and buffer.records == buffer.bytes == 0
    assert buffer.resume(5) == (5, 5) and buffer.unsaved(5) == 0


def test_a_batch_in_flight_older_than_the_buffer_starts_the_resume_range() -> None:
    """A batch numbered and parked but not yet known sent (interrupted by a signal handler
    that then met a restart) is resent too."""
    buffer = ReplayBuffer(1000, 1 << 20)
    assert buffer.resume(10, inflight_first=7) == (7, 10)
    buffer.keep(0, 4, _batch(0, 4))
    assert buffer.resume(10, inflight_first=7) == (0, 10)


def test_past_the_bound_the_oldest_batches_are_forgotten_and_counted() -> None:
    frame = _batch(0, 4)
    buffer = ReplayBuffer(max_records=8, max_bytes=1 << 20)
    for first in range(0, 20, 4):
        buffer.keep(first, 4, frame)
    assert buffer.records == 8 and buffer.forgotten == 12
    assert buffer.resume(20) == (12, 20)
    by_bytes = ReplayBuffer(max_records=1000, max_bytes=2 * len(frame))
    for first in range(0, 12, 4):
        by_bytes.keep(first, 4, frame)
    assert by_bytes.bytes == 2 * len(frame) and by_bytes.forgotten == 4
    one = ReplayBuffer(max_records=2, max_bytes=1 << 20)
    one.keep(0, 4, frame)  # a batch over the bound alone is not kept at all
    assert not one and one.forgotten == 4


def _chunk(name: str) -> bytes:
    return codec.encode_blob(Blob(name, 0, 3, b"png"))


def test_a_files_chunks_are_resent_before_its_record_until_that_record_is_saved() -> None:
    """Media bytes sent ahead of record 5 (a rank on another node) are held with it: resent
    first after a restart, forgotten only once record 5 is saved, and they never move the
    resume range, though the batch carrying record 5 begins below it (issue 38)."""
    buffer = ReplayBuffer(1000, 1 << 20)
    buffer.keep(0, 3, _batch(0, 3))
    assert buffer.keep_blob(5, [_chunk("a.png")])  # records 3 and 4 wait in the buffer
    buffer.keep(3, 3, _batch(3, 3))  # 3, 4 and 5: the batch carrying the file's record
    assert buffer.records == 6 and len(buffer) == 3
    kinds = [type(codec.decode(f, MAX)).__name__ for f in buffer.frames()]
    assert kinds == ["RecordBatch", "Blob", "RecordBatch"]
    assert buffer.saved(3)
    assert buffer.resume(6) == (3, 6)  # from the batch, not the chunk's record
    assert buffer.saved(5)  # record 5 not yet saved: its chunk stays
    assert [type(codec.decode(f, MAX)).__name__ for f in buffer.frames()] == [
        "Blob",
        "RecordBatch",
    ]
    assert buffer.saved(6)
    assert not buffer and buffer.bytes == buffer.blob_bytes == buffer.records == 0
    # chunks have a budget of their own, all of a file or none; they push out no record
    chunk = _chunk("b.png")
    small = ReplayBuffer(1000, 2 * len(chunk))
    small.keep(0, 1, b"x" * 10)
    assert small.keep_blob(1, [chunk, chunk])
    assert not small.keep_blob(2, [chunk])  # over the budget: not held at all
    assert small.records == 1 and small.forgotten == 0 and len(small) == 3
    # a batch dropped (not sent) forgets its records' chunks
    small.forget_blobs(1, 2)
    assert len(small) == 1 and small.blob_bytes == 0 and small.records == 1


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("keep"), st.integers(0, 40)),
            st.tuples(st.just("saved"), st.integers(0, 400)),
            st.tuples(st.just("blob"), st.integers(1, 3)),
        ),
        max_size=60,
    ),
    st.integers(1, 120),
    st.integers(1, 40),
)
def test_the_counts_match_what_is_held(
    ops: list[tuple[str, int]], max_records: int, max_frames: int
) -> None:
    """Whatever the order of keeps, saves and chunks: the counts are what is held, held batches
    are consecutive and unsaved, within the bound, every record kept is held, saved or
    forgotten, and a chunk is held while its record is not saved."""
    frame_size = 10
    buffer = ReplayBuffer(max_records, max_frames * frame_size)
    seq = 0
    for op, n in ops:
        if op == "keep":
            buffer.keep(seq, n, b"x" * frame_size)
            seq += n
        elif op == "blob":  # n chunks of the next record, which the next batch carries
            buffer.keep_blob(seq, [b"c" * frame_size] * n)
        else:
            buffer.saved(min(n, seq))
    entries = list(buffer._batches)
    budget = max_frames * frame_size
    assert buffer.bytes == sum(len(frame) for _, count, frame in entries if count) <= budget
    assert buffer.blob_bytes == sum(len(f) for _, count, f in entries if not count) <= budget
    assert all(first >= buffer.saved_below for first, count, _ in entries if not count)
    assert [f for f, count, _ in entries if not count] == sorted(
        f for f, count, _ in entries if not count
    )
    batches = [entry for entry in entries if entry[1]]
    assert buffer.records == sum(count for _, count, _ in batches) <= max_records
    for (first, count, _), (after, _, _) in itertools.pairwise(batches):
        assert first + count == after  # consecutive: a resend leaves no hole of its own
    assert all(first + count > buffer.saved_below for first, count, _ in batches)
    assert not batches or batches[-1][0] + batches[-1][1] == seq
    if not batches:
        assert buffer.resume(seq) == (seq, seq)
    else:
        held_from = batches[0][0]
        # Below what is held: saved, or forgotten (some of them both: saved after forgotten).
        assert held_from <= buffer.saved_below + buffer.forgotten
        assert buffer.resume(seq) == (held_from, seq)


# ---- against a fake logger, through real frames ------------------------------------------


class FakeSocket:
    """One direction of a connection: frames in order, lost when the far end dies."""

    def __init__(self) -> None:
        self.frames: deque[bytes] = deque()

    def send(self, frame: bytes) -> None:
        self.frames.append(frame)

    def drain(self) -> list[bytes]:
        out = list(self.frames)
        self.frames.clear()
        return out


@dataclass
class FakeLogger:
    """The logger's part for one rank: takes records from its saved point on (a successor
    starts where the run's file ends), writes them, and says ``Saved`` once they are on disk.
    A gap in the numbers is written as a counted drop, as the receiver counts it."""

    run: list[tuple[int, bool]]  # on disk (survives the logger): (seq, a record or a drop)
    pending: list[tuple[int, bool]] = field(default_factory=list)  # written, not on disk

    @property
    def expected(self) -> int:
        """The next record number it takes."""
        return len(self.run) + len(self.pending)

    def take(self, frame: bytes) -> None:
        message = codec.decode(frame, MAX)
        if isinstance(message, Hello):
            assert message.resume is not None
            first, _ = message.resume
            self._gap(first)  # forgotten by the rank's bound: never coming
            return
        assert isinstance(message, RecordBatch)
        for seq, (_, _, data) in enumerate(message.records, message.first_seq):
            assert data == {"seq": seq}
            if seq < self.expected:
                continue  # already taken: a resend
            self._gap(seq)
            self.pending.append((seq, True))

    def _gap(self, upto: int) -> None:
        self.pending.extend((seq, False) for seq in range(self.expected, upto))

    def save(self, how_many: int) -> bytes:
        """``how_many`` of the pending records reach disk (a prefix): ``Saved`` for them."""
        self.run.extend(self.pending[:how_many])
        del self.pending[:how_many]
        return codec.encode_saved(Saved(len(self.run)))


class FakeRank:
    """A rank's use of its replay buffer: numbers, sends and keeps; trims on ``Saved``; says
    hello again and resends when a new logger comes."""

    def __init__(self, max_records: int) -> None:
        self.replay = ReplayBuffer(max_records, 1 << 30)
        self.seq = 0
        self.out = FakeSocket()

    def log(self, count: int) -> None:
        frame = _batch(self.seq, count)
        self.out.send(frame)
        self.replay.keep(self.seq, count, frame)
        self.seq += count

    def reply(self, frame: bytes) -> None:
        message = codec.decode(frame, MAX)
        assert isinstance(message, Saved)
        self.replay.saved(message.seq)

    def hello_again(self) -> None:
        resume = self.replay.resume(self.seq)
        self.out.send(codec.encode_hello(Hello("t", 1, "h", 0, None, resume)))
        for frame in self.replay.frames():
            self.out.send(frame)


_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("log"), st.integers(1, 5)),
        st.just(("deliver", 0)),  # the logger reads what was sent
        st.tuples(st.just("save"), st.integers(0, 6)),  # some reach disk; Saved reaches the rank
        st.tuples(st.just("save-unsaid"), st.integers(0, 6)),  # on disk; the Saved is lost
        st.just(("kill", 0)),  # what was in flight and not on disk is lost
    ),
    max_size=50,
)


def _simulate(steps: list[tuple[str, int]], max_records: int) -> tuple[FakeRank, FakeLogger]:
    rank = FakeRank(max_records)
    logger = FakeLogger(run=[])
    for op, n in [*steps, ("deliver", 0), ("save", 1 << 20)]:
        if op == "log":
            rank.log(n)
        elif op == "deliver":
            for frame in rank.out.drain():
                logger.take(frame)
        elif op == "save":
            rank.reply(logger.save(n))
        elif op == "save-unsaid":
            logger.save(n)
        else:
            rank.out.drain()  # frames queued for the dead logger: gone with it
            # The successor starts where the run's file ends; its REHELLO makes the rank
            # say hello with the range it resends, then resend.
            logger = FakeLogger(run=logger.run)
            rank.hello_again()
    return rank, logger


@settings(max_examples=300)
@given(_STEPS)
def test_every_record_reaches_the_run_exactly_once_across_logger_deaths(
    steps: list[tuple[str, int]],
) -> None:
    rank, logger = _simulate(steps, max_records=1 << 20)
    assert rank.replay.forgotten == 0
    assert logger.run == [(seq, True) for seq in range(rank.seq)]
    assert not rank.replay and rank.replay.saved_below == rank.seq


@settings(max_examples=300)
@given(_STEPS, st.integers(1, 12))
def test_a_bounded_buffer_loses_records_only_counted_and_never_twice(
    steps: list[tuple[str, int]], max_records: int
) -> None:
    """Past the bound a record may be lost to a logger's death, but never silently: the run
    has every record once or its drop counted, and only records the buffer forgot."""
    rank, logger = _simulate(steps, max_records)
    assert [seq for seq, _ in logger.run] == list(range(rank.seq))
    dropped = sum(1 for _, record in logger.run if not record)
    assert dropped <= rank.replay.forgotten
    if not any(op == "kill" for op, _ in steps):
        assert dropped == 0  # the bound alone loses nothing: it only limits a resend
