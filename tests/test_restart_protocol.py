"""A rank and a restarted logger's receiver, in-process with real ZeroMQ: the rank's
batches reach the first receiver, which "dies" (stops, its socket closed) having saved
the first 100; a second receiver binds the same address (generation 1) and gets every
record from 100 on exactly once, in order, and none below."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
import warnings

import pytest

from wandb_funnel._logger.events import Attached, Records
from wandb_funnel._logger.receiver import Receiver
from wandb_funnel._protocol import codec
from wandb_funnel._protocol.sockets import LoggerSocket, private_ipc_endpoint, remove_ipc_dir
from wandb_funnel._worker.stream import Stream

MAX = 1 << 20


def _records(rx: Receiver) -> list[Records]:
    out: list[Records] = []
    while True:
        try:
            events = rx.events.get(0.0)  # a list: what one drain took
        except queue.Empty:
            return out
        out.extend(event for event in events if isinstance(event, Records))


def test_a_restarted_receiver_takes_each_unsaved_record_once() -> None:
    address, directory = private_ipc_endpoint()
    first = LoggerSocket(address, 1000, MAX)
    rx = Receiver(first, "tok", MAX, 100_000)
    rx.start()
    stream = Stream(address, "tok", requested_rank=1, logger_pid=os.getpid(), restarted=True)
    second: LoggerSocket | None = None
    rx2: Receiver | None = None
    try:
        assert stream.wait_welcome(5.0)
        for step in range(300):
            stream.push(codec.encode_record(step, True, {"x": step}, MAX))
        stream.flush(1.0)
        deadline = time.monotonic() + 5
        while rx.streams.received() < 300 and time.monotonic() < deadline:
            time.sleep(0.01)
        rx.stop(2.0)
        first.close()  # the first logger is gone; nothing was said to be saved
        second = LoggerSocket(address, 1000, MAX)
        rx2 = Receiver(second, "tok", MAX, 100_000, generation=1, saved={1: 100}, used_ranks={1})
        rx2.start()
        for step in range(300, 310):  # logged after the death: reaches the new logger
            stream.push(codec.encode_record(step, True, {"x": step}, MAX))
        deadline = time.monotonic() + 10
        while rx2.streams.received() < 310 and time.monotonic() < deadline:
            stream.flush_if_stale(time.monotonic())
            time.sleep(0.05)
        assert stream.replays >= 1
        assert rx2.streams.received() == 310  # the 100 saved count as received
        steps = [r[0] for event in _records(rx2) for r in event.records]
        assert steps == list(range(100, 310))
        # resent: 100..299, and 300..309 too when their batch reached the new logger before
        # the rank's second hello (it then dropped it as a stranger's frame)
        assert rx2.replayed in (200, 210)
        assert rx2.dropped == 0 and rx2.junk_frames == 0
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            stream.close("test over", 1.0)
        rx.stop(1.0)
        if rx2 is not None:
            rx2.stop(2.0)
        if second is not None:
            second.close()
        remove_ipc_dir(directory)


def test_a_rank_whose_buffer_forgot_records_is_counted_as_dropped() -> None:
    """The rank resends from 200 but the run has only 0..99: 100 records are counted."""
    address, directory = private_ipc_endpoint()
    sock = LoggerSocket(address, 1000, MAX)
    rx = Receiver(sock, "tok", MAX, 100_000, generation=1, saved={1: 100})
    rx.start()
    try:
        identity = b"\x01abcdefghijk"
        from wandb_funnel._protocol.messages import Hello

        hello = Hello("tok", os.getpid(), "h", 1, None, (200, 300))
        import zmq

        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.IDENTITY, identity)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(address)
        dealer.send(codec.encode_hello(hello))
        deadline = time.monotonic() + 5
        while rx.dropped < 100 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert rx.dropped == 100
        assert isinstance(rx.events.get(1.0)[0], Attached)
        dealer.close()
    finally:
        rx.stop(2.0)
        sock.close()
        remove_ipc_dir(directory)


def test_a_rank_closing_when_the_logger_dies_waits_for_its_successor() -> None:
    """The rank has said goodbye (nothing left to send) when the logger dies before its
    receipt: it waits, within its exit timeout, pokes the address with heartbeats, and the
    successor (1.5 s later) gets its hello, every record and its goodbye, and answers."""

    address, directory = private_ipc_endpoint()
    first = LoggerSocket(address, 1000, MAX)
    # The "logger": a process of our own whose death the rank sees by its pid.
    fake = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stream = Stream(address, "tok", requested_rank=1, logger_pid=fake.pid, restarted=True)
    second: LoggerSocket | None = None
    rx2: Receiver | None = None
    caught: list[str] = []
    try:
        # The first logger never answers the goodbye: it dies with the goodbye unanswered.
        _log_50(stream)
        closer = _closing(stream, 8.0, caught)
        time.sleep(0.5)  # the goodbye is out; no receipt
        _die(fake, first)
        time.sleep(1.5)  # the owner takes a while to start the next one
        second = LoggerSocket(address, 1000, MAX)
        rx2 = Receiver(second, "tok", MAX, 100_000, generation=1, saved={})
        rx2.start()
        closer.join(10)
        assert not closer.is_alive()
        assert rx2.streams.received() == 50
        assert caught == []  # its records reached the successor: nothing to warn about
    finally:
        _clean_up(fake, rx2, second, directory)


@pytest.mark.parametrize("how", ["budget-spent", "queue-full"])
def test_a_rank_that_closes_after_the_logger_died_waits_for_its_successor(how: str) -> None:
    """The logger is already dead when the rank closes, and either the close's own budget is
    spent before it could look (an owner's close late in its budget) or its socket's queue is
    full (records logged while nobody read them): the rank still waits, within the restart
    bound, for the successor (1.5 s later), which gets every record and the goodbye."""

    address, directory = private_ipc_endpoint()
    first = LoggerSocket(address, 1000, MAX)
    fake = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stream = Stream(address, "tok", requested_rank=1, logger_pid=fake.pid, restarted=True)
    second: LoggerSocket | None = None
    rx2: Receiver | None = None
    try:
        _log_50(stream)
        _die(fake, first)
        if how == "queue-full":
            _fill_the_queue(stream)

        def successor() -> None:
            nonlocal second, rx2
            time.sleep(1.5)  # the owner takes a while to start the next one
            second = LoggerSocket(address, 1000, MAX)
            rx2 = Receiver(second, "tok", MAX, 100_000, generation=1, saved={})
            rx2.start()

        starter = threading.Thread(target=successor)
        starter.start()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            stream.close("done", 0.0 if how == "budget-spent" else 0.5)
        starter.join()
        assert [str(w.message) for w in seen] == []  # nothing may be missing: no warning
        assert rx2 is not None and rx2.streams.received() == 50
    finally:
        _clean_up(fake, rx2, second, directory)


def test_a_rank_waiting_for_a_successor_that_will_not_come_leaves_when_the_socket_goes() -> None:
    """The logger is dead, the rank's queue is full, and no successor comes: once the owner
    removes the socket (its close, or its supervisor giving up) the rank stops waiting,
    long before the restart bound, and says what may be missing and that its goodbye did not
    leave."""
    address, directory = private_ipc_endpoint()
    first = LoggerSocket(address, 1000, MAX)
    fake = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stream = Stream(address, "tok", requested_rank=1, logger_pid=fake.pid, restarted=True)
    caught: list[str] = []
    try:
        _log_50(stream)
        _die(fake, first)
        _fill_the_queue(stream)
        closer = _closing(stream, 0.5, caught)
        time.sleep(1.0)  # past the close's own timeout: it waits for a successor
        assert closer.is_alive()
        remove_ipc_dir(directory)  # the owner: no logger will follow
        closer.join(10)  # the restart bound is 30 s
        assert not closer.is_alive()
        assert len(caught) == 1 and "goodbye not sent" in caught[0], caught
        assert "up to 50 records from this rank may be missing" in caught[0], caught
    finally:
        _clean_up(fake, None, None, directory)


def _log_50(stream: Stream) -> None:
    for step in range(50):
        stream.push(codec.encode_record(step, True, {"x": step}, MAX))
    stream.flush(1.0)


def _die(fake: subprocess.Popen[bytes], sock: LoggerSocket) -> None:
    """The "logger" dies: its pid (what the rank looks at) and its socket."""
    fake.kill()
    fake.wait()
    sock.close()


def _fill_the_queue(stream: Stream) -> None:
    """Heartbeats until the rank's queue takes no more (nobody reads it)."""
    heartbeat = codec.encode_batch(50, [])
    while stream._sock.try_send(heartbeat):
        pass


def _closing(stream: Stream, timeout: float, caught: list[str]) -> threading.Thread:
    """``stream.close`` on a thread of its own; its warnings land in ``caught``."""

    def close() -> None:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            stream.close("done", timeout)
        caught.extend(str(w.message) for w in seen)

    closer = threading.Thread(target=close)
    closer.start()
    return closer


def _clean_up(
    fake: subprocess.Popen[bytes],
    rx: Receiver | None,
    sock: LoggerSocket | None,
    directory: str,
) -> None:
    """The fake logger killed, the successor's receiver and socket stopped, the dir gone."""
    fake.kill()
    fake.wait()
    if rx is not None:
        rx.stop(2.0)
    if sock is not None:
        sock.close()
    remove_ipc_dir(directory)
