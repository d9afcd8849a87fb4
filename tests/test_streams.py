"""The streams' numbering: the logger's side of the wire's exactly-once rule, without a
socket (``_logger/streams.py``)."""

from __future__ import annotations

from wandb_funnel._logger.streams import Streams
from wandb_funnel._protocol.messages import Hello


def _hello(rank: int | None = None, resume: tuple[int, int] | None = None) -> Hello:
    return Hello(
        token="t",
        requested_rank=rank,
        pid=10,
        host="here",
        pid_start=None,
        resume=resume,
    )


def test_records_in_order_then_a_gap_the_rank_dropped_itself() -> None:
    streams = Streams(first_auto_rank=1)
    peer, new, lost = streams.hello(b"a", _hello(), 0.0)
    assert (peer.rank, new, lost) == (1, True, 0)
    first = streams.number(peer, 0, 5)
    assert first.new and (first.skip, first.gap, first.end) == (0, 0, 5)
    gapped = streams.number(peer, 8, 2)  # 5..7 never came: the rank counted them
    assert gapped.new and gapped.gap == 3 and gapped.end == 10
    assert peer.dropped == 3 and peer.next_seq == 10


def test_a_repeat_is_nothing_new_and_junk_unless_it_was_resent() -> None:
    streams = Streams(first_auto_rank=1)
    peer, _, _ = streams.hello(b"a", _hello(), 0.0)
    streams.number(peer, 0, 5)
    repeat = streams.number(peer, 2, 2)
    assert not repeat.new and repeat.junk


def test_after_a_restart_what_the_run_has_is_skipped_and_what_was_lost_is_counted() -> None:
    # The run holds rank 3's records below 7; the rank resends 4..12 (0..3 it forgot when
    # its replay buffer was full: those below the saved point were saved anyway).
    streams = Streams(first_auto_rank=1, saved={3: 7}, used_ranks={3})
    peer, new, lost = streams.hello(b"b", _hello(3, resume=(4, 12)), 0.0)
    assert (peer.rank, new, lost) == (3, True, 0)
    assert peer.received == 7  # what the run holds counts as received
    resent = streams.number(peer, 4, 8)
    assert resent.new and resent.skip == 3 and resent.gap == 0 and resent.replayed
    fresh = streams.number(peer, 12, 2)
    assert fresh.new and fresh.skip == 0 and not fresh.replayed


def test_a_resend_that_starts_past_the_saved_point_counts_the_records_it_lost() -> None:
    streams = Streams(first_auto_rank=1, saved={2: 5}, used_ranks={2})
    peer, _, lost = streams.hello(b"c", _hello(2, resume=(9, 15)), 0.0)
    assert lost == 4 and peer.dropped == 4  # 5..8: in no row, and no longer resendable


def test_a_second_hello_of_a_stream_keeps_its_rank_and_widens_its_resend() -> None:
    streams = Streams(first_auto_rank=1, saved={2: 5}, used_ranks={2})
    peer, _, _ = streams.hello(b"c", _hello(2, resume=(5, 10)), 0.0)
    again, new, _ = streams.hello(b"c", _hello(2, resume=(5, 14)), 0.0)
    assert again is peer and not new and peer.replay_until == 14


def test_a_rank_asked_for_twice_goes_to_the_next_free_one() -> None:
    streams = Streams(first_auto_rank=1)
    one, _, _ = streams.hello(b"a", _hello(1), 0.0)
    other, _, _ = streams.hello(b"b", _hello(1), 0.0)
    assert (one.rank, other.rank) == (1, 2)


def test_a_local_rank_is_gone_once_its_pid_is_and_the_socket_was_quiet_after_it() -> None:
    streams = Streams(first_auto_rank=1)
    peer, _, _ = streams.hello(b"a", _hello(), 0.0)
    dead = lambda pid, start: False  # noqa: E731
    assert streams.gone(0.5, "here", dead) == []  # its frames may still be queued
    assert streams.gone(1.5, "here", dead) == [peer] and peer.gone
    assert streams.gone(2.5, "here", dead) == [peer]  # the receiver ends it once: _end
    remote, _, _ = streams.hello(b"r", Hello("t", 11, "elsewhere", None), 0.0)
    alive = lambda pid, start: True  # noqa: E731  (a pid elsewhere means nothing here)
    assert remote not in streams.gone(4.0, "here", alive)
    assert remote in streams.gone(6.0, "here", alive)  # its heartbeats stopped
