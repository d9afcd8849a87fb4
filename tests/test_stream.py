"""_worker.stream: one rank's ordered channel, against a LoggerSocket played by the test.
In-process, real ZeroMQ: what the logger would see, frame by frame."""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Iterator

import pytest

from wandb_funnel._constants import BATCH_RECORDS
from wandb_funnel._protocol import codec
from wandb_funnel._protocol.messages import Ack, Goodbye, Hello, RecordBatch, Welcome
from wandb_funnel._protocol.sockets import LoggerSocket, private_ipc_endpoint, remove_ipc_dir
from wandb_funnel._worker.stream import Stream, open_streams

MAX = 1 << 20


@pytest.fixture
def logger() -> Iterator[tuple[str, LoggerSocket]]:
    address, directory = private_ipc_endpoint()
    sock = LoggerSocket(address, 100, MAX)
    yield address, sock
    sock.close()
    remove_ipc_dir(directory)


def _next(sock: LoggerSocket, timeout: float = 5.0) -> tuple[bytes, object]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.wait(0.1)
        message = sock.recv_nowait()
        if message is not None:
            return message[0], codec.decode(message[1][0], MAX)
    raise AssertionError("nothing arrived")


def _record(step: int) -> bytes:
    return codec.encode_record(step, True, {"x": step}, MAX)


def test_hello_welcome_records_goodbye_ack(logger: tuple[str, LoggerSocket]) -> None:
    address, sock = logger
    stream = Stream(address, "tok", requested_rank=3)
    try:
        identity, hello = _next(sock)
        assert isinstance(hello, Hello)
        assert (hello.token, hello.pid, hello.requested_rank) == ("tok", os.getpid(), 3)
        sock.reply(identity, codec.encode_welcome(Welcome(5)))
        assert stream.wait_welcome(5.0) and stream.rank(0) == 5  # the logger's answer wins
        for step in range(BATCH_RECORDS + 10):
            stream.push(_record(step))
        stream.flush(5.0)
        steps: list[int] = []
        first_seqs: list[int] = []
        while len(steps) < BATCH_RECORDS + 10:
            _, batch = _next(sock)
            assert isinstance(batch, RecordBatch)
            first_seqs.append(batch.first_seq)
            steps += [record[0] for record in batch.records]
        assert steps == list(range(BATCH_RECORDS + 10))  # in order, none twice
        assert first_seqs[0] == 0 and first_seqs[1] == BATCH_RECORDS  # numbered, no gap
        assert stream.produced == BATCH_RECORDS + 10
        assert stream in open_streams()

        def ack_the_goodbye() -> None:
            identity, goodbye = _next(sock)
            assert goodbye == Goodbye(BATCH_RECORDS + 10, "finished", 7)
            sock.reply(identity, codec.encode_ack(Ack(BATCH_RECORDS + 10)))

        acker = threading.Thread(target=ack_the_goodbye)
        acker.start()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a confirmed receipt: nothing to warn about
            stream.close("finished", 5.0, exit_code=7)
        acker.join(5.0)
        assert stream.closed and stream not in open_streams()
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # only after a failure: keep the first error
            stream.close("test over", 0.0)


def test_a_close_nobody_confirms_warns_with_numbers_and_is_bounded(
    logger: tuple[str, LoggerSocket],
) -> None:
    address, _ = logger
    stream = Stream(address, "tok", requested_rank=None)
    stream.push(_record(0))
    t0 = time.monotonic()
    with pytest.warns(UserWarning, match="did not confirm receipt") as caught:
        stream.close("finished", 0.5)
    assert time.monotonic() - t0 < 3.0
    assert "rank ?" in str(caught[0].message)


def test_a_dead_logger_is_not_waited_for(logger: tuple[str, LoggerSocket]) -> None:
    address, _ = logger
    dead_pid = 2**22 + 12345  # above pid_max: no such process
    stream = Stream(address, "tok", requested_rank=1, logger_pid=dead_pid)
    assert not stream.logger_alive()
    assert not stream.wait_welcome(10.0)  # gives up at once, not after 10 s
    stream.push(_record(0))
    t0 = time.monotonic()
    with pytest.warns(UserWarning, match="is gone"):
        stream.close("finished", 10.0)
    assert time.monotonic() - t0 < 2.0


def test_a_logger_on_another_host_is_never_declared_dead(
    logger: tuple[str, LoggerSocket],
) -> None:
    address, _ = logger
    stream = Stream(address, "tok", 1, logger_pid=2**22 + 12345, logger_host="elsewhere")
    try:
        assert stream.logger_alive()  # a pid is only meaningful on its own host
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            stream.close("finished", 0.0)


def test_an_opening_run_is_asked_again_until_it_tells_its_name(
    logger: tuple[str, LoggerSocket],
) -> None:
    """An online run opens in the background: the first Welcome has no run info. The stream
    says Hello again (every half second) until a Welcome carries it, and keeps it."""
    address, sock = logger
    stream = Stream(address, "tok", requested_rank=1)
    try:
        identity, hello = _next(sock)
        assert isinstance(hello, Hello)
        sock.reply(identity, codec.encode_welcome(Welcome(1)))  # the run is still opening
        info = {"name": "run-x", "dir": "/runs/x/files", "offline": True}
        answered: list[int] = []

        def answer_the_second_hello() -> None:
            again, message = _next(sock)
            assert again == identity and isinstance(message, Hello)
            answered.append(1)
            sock.reply(identity, codec.encode_welcome(Welcome(1, info)))

        responder = threading.Thread(target=answer_the_second_hello)
        responder.start()
        assert stream.fetch_run_info(10.0) == info
        responder.join(5.0)
        assert answered == [1] and stream.rank(0) == 1
        assert stream.fetch_run_info(0.0) == info  # kept: no further question
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            stream.close("test over", 0.0)


def test_a_run_that_never_opens_costs_a_bounded_wait(logger: tuple[str, LoggerSocket]) -> None:
    address, sock = logger
    stream = Stream(address, "tok", requested_rank=1)
    try:
        identity, _ = _next(sock)
        sock.reply(identity, codec.encode_welcome(Welcome(1)))
        t0 = time.monotonic()
        assert stream.fetch_run_info(0.6) is None
        assert 0.5 <= time.monotonic() - t0 < 3.0
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            stream.close("test over", 0.0)


def test_sent_batches_are_kept_until_saved_and_resent_to_a_restarted_logger(
    logger: tuple[str, LoggerSocket],
) -> None:
    """A stream keeps every batch it sent until the logger's ``Saved``; a ``Rehello`` (a
    restarted logger that does not know it) makes it say hello again with the range it
    resends, keep its rank, and resend the unsaved batches in order."""
    from wandb_funnel._protocol.messages import Saved

    address, sock = logger
    stream = Stream(address, "tok", requested_rank=2)
    try:
        identity, _ = _next(sock)
        sock.reply(identity, codec.encode_welcome(Welcome(4)))
        assert stream.wait_welcome(5.0)
        for step in range(3 * BATCH_RECORDS):
            stream.push(_record(step))  # three full batches, sent as they fill
        for _ in range(3):
            assert isinstance(_next(sock)[1], RecordBatch)
        sock.reply(identity, codec.encode_saved(Saved(BATCH_RECORDS)))  # the first is saved
        sock.reply(identity, codec.REHELLO_FRAME)
        stream.flush_if_stale(time.monotonic())  # the flusher's tick reads the replies
        _, hello = _next(sock)
        assert isinstance(hello, Hello)
        assert hello.requested_rank == 4  # the rank it had
        assert hello.resume == (BATCH_RECORDS, 3 * BATCH_RECORDS)
        resent = [_next(sock)[1] for _ in range(2)]
        assert [b.first_seq for b in resent if isinstance(b, RecordBatch)] == [
            BATCH_RECORDS,
            2 * BATCH_RECORDS,
        ]
        assert stream.replays == 1
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            stream.close("test over", 0.0)


def test_the_replay_buffer_is_bounded_and_forgets_the_oldest(
    logger: tuple[str, LoggerSocket],
) -> None:
    """Past ``replay_records`` the oldest batches are forgotten, never waited for: a resend
    then starts at the oldest batch still held (the logger counts the gap as dropped)."""
    address, sock = logger
    stream = Stream(address, "tok", requested_rank=1, replay_records=2 * BATCH_RECORDS)
    try:
        identity, _ = _next(sock)
        for step in range(5 * BATCH_RECORDS):
            stream.push(_record(step))
        assert stream._replay.records == 2 * BATCH_RECORDS
        assert stream._replay.forgotten == 3 * BATCH_RECORDS
        sock.reply(identity, codec.REHELLO_FRAME)
        deadline = time.monotonic() + 5
        while stream.replays == 0 and time.monotonic() < deadline:
            stream.flush_if_stale(time.monotonic())
        hello = None
        while not isinstance(hello, Hello):
            _, hello = _next(sock)
        assert hello.resume == (3 * BATCH_RECORDS, 5 * BATCH_RECORDS)
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            stream.close("test over", 0.0)
