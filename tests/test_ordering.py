"""The reorder buffer: every record comes out once, rows in step order, delays bounded."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from wandb_funnel._logger.ordering import Reorderer, Row


def _check_output(rows: list[Row], records: list[tuple[int, int, str]]) -> None:
    """Each record (rank, step, unique key) appears exactly once, at its own step and rank;
    non-late rows come out in strictly increasing step order."""
    seen: list[tuple[int, int, str]] = []
    last = -1
    for row in rows:
        if not row.late:
            assert row.step > last, f"row {row.step} released after {last}"
            last = row.step
        else:
            assert row.step <= last
        for rank, data in row.parts.items():
            seen.extend((rank, row.step, key) for key in data)
    assert sorted(seen) == sorted(records)


@st.composite
def interleavings(draw: st.DrawFn) -> tuple[list[tuple[int, int, bool]], list[float]]:
    """Per-rank non-decreasing step streams, interleaved arbitrarily, with arbitrary clocks."""
    n_ranks = draw(st.integers(1, 5))
    streams = []
    for _ in range(n_ranks):
        steps = sorted(draw(st.lists(st.integers(0, 30), max_size=15)))
        # A record may commit its step only if the rank's next record is at a later step
        # (after a commit the client itself moves on: step S again would be going backwards).
        streams.append(
            [
                (s, draw(st.booleans()) if i + 1 == len(steps) or steps[i + 1] > s else False)
                for i, s in enumerate(steps)
            ]
        )
    order = []
    cursors = [0] * n_ranks
    remaining = sum(map(len, streams))
    while remaining:
        rank = draw(st.sampled_from([r for r in range(n_ranks) if cursors[r] < len(streams[r])]))
        step, committed = streams[rank][cursors[rank]]
        cursors[rank] += 1
        remaining -= 1
        order.append((rank, step, committed))
    gaps = draw(st.lists(st.floats(0, 3), min_size=len(order), max_size=len(order)))
    return order, gaps


@settings(max_examples=400, deadline=None)
@given(interleavings(), st.floats(0, 2), st.integers(1, 8))
def test_any_interleaving_yields_every_record_in_step_order(
    case: tuple[list[tuple[int, int, bool]], list[float]], window: float, max_rows: int
) -> None:
    """Property: whatever the interleaving and timing, no record is lost or duplicated, and
    rows leave in increasing step order (late records on their own rows)."""
    order, gaps = case
    buf = Reorderer(window=window, max_pending_rows=max_rows)
    now = 0.0
    out: list[Row] = []
    records = []
    for i, ((rank, step, committed), gap) in enumerate(zip(order, gaps, strict=True)):
        now += gap
        key = f"k{i}"
        records.append((rank, step, key))
        buf.add(rank, step, committed, {key: i}, now)
        out += buf.pop_ready(now)
        assert buf.pending_rows <= max_rows + 1
    out += buf.pop_all()
    _check_output(out, records)
    assert sum(r.records for r in out) == len(order)
    assert buf.late_records == sum(r.records for r in out if r.late)


@settings(max_examples=200, deadline=None)
@given(interleavings())
def test_no_late_records_when_ranks_wait_for_each_other(
    case: tuple[list[tuple[int, int, bool]], list[float]],
) -> None:
    """With an infinite window, ranks attached up front and every rank finishing, ordering is
    exact: nothing is late."""
    order, _ = case
    buf = Reorderer(window=1e9, max_pending_rows=10**9)
    for rank in {r for r, _, _ in order}:
        buf.rank_attached(rank)
    out: list[Row] = []
    records = []
    for i, (rank, step, committed) in enumerate(order):
        records.append((rank, step, f"k{i}"))
        buf.add(rank, step, committed, {f"k{i}": i}, 0.0)
        out += buf.pop_ready(0.0)
    for rank in {r for r, _, _ in order}:
        buf.rank_done(rank)
    out += buf.pop_ready(0.0)
    assert buf.pending_rows == 0
    _check_output(out, records)
    assert buf.late_records == 0


def test_row_waits_for_every_logging_rank() -> None:
    """A row leaves only once every logging rank has moved past its step."""
    buf = Reorderer(window=10.0, max_pending_rows=100)
    buf.add(0, 0, True, {"a": 1}, 0.0)
    buf.add(1, 0, False, {"a": 2}, 0.0)  # rank 1 still open at step 0
    buf.add(0, 1, True, {"a": 3}, 0.0)
    assert buf.pop_ready(0.1) == []
    buf.add(1, 1, False, {"a": 4}, 0.2)  # rank 1 moved to step 1: step 0 is complete
    rows = buf.pop_ready(0.2)
    assert [r.step for r in rows] == [0]
    assert rows[0].parts == {0: {"a": 1}, 1: {"a": 2}}


def test_attached_rank_that_has_not_logged_holds_rows() -> None:
    """A rank that attached but has not logged yet still merges at step 0 (DDP start skew)."""
    buf = Reorderer(window=5.0, max_pending_rows=100)
    buf.rank_attached(0)
    buf.rank_attached(1)
    buf.add(0, 0, True, {"loss": 1.0}, 0.0)
    buf.add(0, 1, True, {"loss": 1.0}, 0.0)
    assert buf.pop_ready(0.05) == []
    buf.add(1, 0, True, {"loss": 3.0}, 0.05)
    rows = buf.pop_ready(0.05)
    assert [r.step for r in rows] == [0] and set(rows[0].parts) == {0, 1}


def test_expected_ranks_that_never_attach_cost_one_window_not_one_a_row() -> None:
    """torchrun with only rank 0 calling wandb (nanoGPT, HF, most clients): rank 1 is expected
    but never attaches. The first row waits one window for it; from then on every row leaves
    as soon as rank 0 moves past it (issue 23: every row waited 2 s)."""
    buf = Reorderer(window=2.0, max_pending_rows=100)
    buf.rank_expected(0)
    buf.rank_expected(1)
    buf.rank_attached(0, 0.0)
    buf.add(0, 0, True, {"loss": 1.0}, 0.1)
    assert buf.pop_ready(1.0) == []  # rank 1 may still be on its way
    assert buf.next_deadline() == 2.1
    assert [r.step for r in buf.pop_ready(2.1)] == [0]
    for step in range(1, 5):
        buf.add(0, step, True, {"loss": 1.0}, 2.1 + step)
        rows = buf.pop_ready(2.1 + step)  # no wait: rank 1 no longer holds rows
        assert [r.step for r in rows] == [step]


def test_an_expected_rank_that_attaches_in_time_still_merges() -> None:
    """Within the first window an expected rank that attaches late still merges at step 0,
    and holds later rows as any attached rank does."""
    buf = Reorderer(window=2.0, max_pending_rows=100)
    for rank in (0, 1):
        buf.rank_expected(rank)
    buf.add(0, 0, True, {"loss": 1.0}, 0.0)
    buf.add(0, 1, True, {"loss": 1.0}, 0.0)
    buf.rank_attached(1, 1.5)
    assert buf.pop_ready(1.5) == []
    buf.add(1, 0, True, {"loss": 3.0}, 1.9)
    rows = buf.pop_ready(1.9)
    assert [r.step for r in rows] == [0] and set(rows[0].parts) == {0, 1}
    assert buf.pop_ready(3.0) == []  # rank 1 attached: it still holds step 1, not forgotten
    buf.add(1, 1, True, {"loss": 3.0}, 3.0)
    assert [r.step for r in buf.pop_ready(3.0)] == [1]


def test_an_expected_rank_attaching_after_the_first_window_lands_late_then_merges() -> None:
    buf = Reorderer(window=1.0, max_pending_rows=100)
    for rank in (0, 1):
        buf.rank_expected(rank)
    buf.add(0, 0, True, {"a": 0}, 0.0)
    assert [r.step for r in buf.pop_ready(1.0)] == [0]  # rank 1 forgotten
    buf.rank_attached(1, 1.5)  # attaches after all: holds rows again from now on
    buf.add(0, 1, True, {"a": 1}, 1.6)
    assert buf.pop_ready(1.6) == []
    buf.add(1, 0, True, {"a": 9}, 1.7)  # its step 0 was written: late, kept, flagged
    buf.add(1, 1, True, {"a": 8}, 1.7)
    rows = buf.pop_ready(1.7)
    assert [(r.step, r.late) for r in rows] == [(0, True), (1, False)]
    assert set(rows[1].parts) == {0, 1} and buf.late_records == 1


def test_straggler_delays_by_at_most_the_window() -> None:
    """A rank that stops sending holds rows back for the window, then they go."""
    buf = Reorderer(window=2.0, max_pending_rows=100)
    buf.add(1, 0, False, {"x": 0}, 0.0)  # rank 1 stalls at step 0
    for step in range(5):
        buf.add(0, step, True, {"y": step}, 0.5)
    assert buf.pop_ready(1.9) == []
    assert buf.next_deadline() == 2.0
    assert [r.step for r in buf.pop_ready(2.1)] == [0]  # first seen at 0.0
    assert buf.pop_ready(2.4) == []
    assert [r.step for r in buf.pop_ready(2.6)] == [1, 2, 3, 4]  # first seen at 0.5


def test_rare_rank_does_not_stall_and_lands_at_its_step() -> None:
    """A rank that logs every 100 steps lets rank 0's rows through and lands at its own step."""
    buf = Reorderer(window=1.0, max_pending_rows=1000)
    out: list[Row] = []
    now = 0.0
    buf.add(1, 0, False, {"rare": 0}, now)
    for step in range(250):
        now += 0.01
        buf.add(0, step, True, {"loss": step}, now)
        if step % 100 == 0 and step:
            buf.add(1, step, False, {"rare": step}, now)
        out += buf.pop_ready(now)
    assert out and max(r.step for r in out) >= 190  # rank 0 was not held at step 0
    out += buf.pop_all()
    rare = [(r.step, r.parts[1]["rare"]) for r in out if 1 in r.parts]
    assert rare == [(0, 0), (100, 100), (200, 200)]
    assert buf.late_records == 0


def test_late_record_is_flagged_and_kept() -> None:
    """A record for an already-written step comes out on a late row at its own step."""
    buf = Reorderer(window=0.0, max_pending_rows=100)
    buf.add(0, 5, True, {"a": 1}, 0.0)
    assert [r.step for r in buf.pop_ready(0.0)] == [5]
    buf.add(1, 3, True, {"b": 2}, 0.1)
    rows = buf.pop_ready(0.1)
    assert len(rows) == 1 and rows[0].late and rows[0].step == 3 and rows[0].parts == {1: {"b": 2}}
    assert buf.late_records == 1


def test_memory_bound_forces_oldest_rows_out() -> None:
    """With a stalled rank and an endless window, pending rows never exceed the bound."""
    buf = Reorderer(window=1e9, max_pending_rows=10)
    buf.add(1, 0, False, {}, 0.0)
    released = 0
    for step in range(1000):
        buf.add(0, step, True, {"s": step}, 0.0)
        released += len(buf.pop_ready(0.0))
        assert buf.pending_rows <= 11
    assert released >= 980


def test_same_rank_same_step_merges_later_wins() -> None:
    buf = Reorderer(window=0.0, max_pending_rows=10)
    buf.add(0, 0, False, {"a": 1, "b": 1}, 0.0)
    buf.add(0, 0, True, {"a": 2}, 0.0)
    (row,) = buf.pop_all()
    assert row.parts == {0: {"a": 2, "b": 1}} and row.records == 2


def test_a_finished_rank_never_holds_rows_again() -> None:
    """Records from a rank that finished or died (a backlog read late) do not revive its
    floor: later rows still flow without waiting for the window."""
    buf = Reorderer(window=100.0, max_pending_rows=100)
    buf.rank_attached(0)
    buf.rank_attached(1)
    buf.rank_done(1)
    buf.add(1, 5, False, {"stray": 1}, 0.0)
    buf.add(0, 0, True, {"a": 0}, 0.0)
    buf.add(0, 6, True, {"a": 6}, 0.0)
    assert [r.step for r in buf.pop_ready(0.0)] == [0, 5, 6]


def test_a_rank_attaching_late_holds_rows_for_another_window() -> None:
    """Spawn workers that come up one by one (slowly, on a loaded machine) still merge at
    their first steps: each attach restarts the window of the rows already pending."""
    buf = Reorderer(window=2.0, max_pending_rows=100)
    buf.rank_attached(1, 0.0)
    buf.add(1, 0, True, {"loss": 1.0}, 0.0)
    buf.add(1, 1, False, {"loss": 1.0}, 0.1)  # step 1 stays open: rank 1 may add to it
    buf.rank_attached(2, 1.5)  # attached 1.5 s after row 0 arrived; has not logged yet
    assert buf.next_deadline() == 3.5
    assert buf.pop_ready(2.5) == []  # without the attach, row 0 would be overdue here
    buf.add(2, 0, True, {"loss": 3.0}, 2.6)
    rows = buf.pop_ready(2.6)
    assert [r.step for r in rows] == [0] and set(rows[0].parts) == {1, 2}
    assert buf.late_records == 0
    buf.rank_done(2)  # rank 1 stalls at its open step 1: the row goes a window after the attach
    assert buf.pop_ready(3.4) == [] and [r.step for r in buf.pop_ready(3.6)] == [1]


def test_ranks_that_keep_attaching_delay_rows_at_most_two_windows() -> None:
    """DataLoader workers forked every epoch attach again and again: a row still goes once it
    has waited twice the window."""
    buf = Reorderer(window=2.0, max_pending_rows=100)
    buf.rank_attached(1, 0.0)
    buf.add(1, 0, False, {"x": 0}, 0.0)  # step 0 stays open: only the window releases it
    for t in (1.0, 2.0, 3.0, 3.9):
        buf.rank_attached(10 + int(t * 10), t)  # a new rank every second; none logs
        assert buf.next_deadline() == min(t + 2.0, 4.0)
    assert buf.pop_ready(3.99) == []
    assert [r.step for r in buf.pop_ready(4.0)] == [0]


def test_pop_all_in_slices_then_drop_all_counts_the_rest() -> None:
    """At close: rows come out in step order a slice at a time, whatever the floors; what is
    left is counted (pending and late rows alike) and forgotten."""
    buf = Reorderer(window=1e9, max_pending_rows=1000)
    buf.rank_attached(1)  # holds every row: pop_ready would release nothing
    for step in range(10):
        buf.add(0, step, True, {"s": step}, 0.0)
    assert buf.pop_ready(0.0) == []
    assert [r.step for r in buf.pop_all(3)] == [0, 1, 2]
    buf.add(0, 1, True, {"late": 1}, 0.0)  # at or below the last released step: late
    buf.add(0, 2, True, {"late": 2}, 0.0)
    # Late rows come first and do not count against the limit.
    assert [(r.step, r.late) for r in buf.pop_all(1)] == [(1, True), (2, True), (3, False)]
    buf.add(0, 1, True, {"late": 1}, 0.0)
    buf.add(1, 7, False, {"t": 1}, 0.0)
    assert buf.drop_all() == 6 + 1 + 1  # steps 4-9, rank 1's record at 7, the late one
    assert buf.pending_rows == 0 and buf.pop_all() == [] and buf.next_deadline() is None


def test_rows_own_their_data() -> None:
    """A row keeps the decoded dict it was given (no copy per record on the logger's hot
    path), which is safe because nothing else holds it: the receiver decodes every record
    afresh for one row, and the row builder copies what it returns. Pinned here: a merge at
    the same step changes only that row's dict, and building a row (wandb then adds its own
    keys to what it logs) never changes the row."""
    from wandb_funnel._logger.reduce import RowBuilder

    first, second, other = {"loss": 1.0}, {"acc": 0.5}, {"loss": 3.0}
    order = Reorderer(0.0, 100)
    order.add_batch(0, [[0, False, first], [0, True, second]], 0.0)
    order.add_batch(1, [[0, True, other]], 0.0)
    (row,) = order.pop_ready(1.0, True, 10)
    assert row.parts[0] is first and first == {"loss": 1.0, "acc": 0.5}
    assert second == {"acc": 0.5} and other == {"loss": 3.0}
    for mode in ("auto", "shared"):
        out = RowBuilder(mode, {}, "step").build(row)
        out["_timestamp"] = 1.0  # what wandb.log does to the dict it is given
        assert row.parts == {0: {"loss": 1.0, "acc": 0.5}, 1: {"loss": 3.0}}
    single = Row(5)
    single.add(0, {"x": 1})
    built = RowBuilder("auto", {}, "step").build(single)
    built["x"] = 99
    assert single.parts[0] == {"x": 1}
