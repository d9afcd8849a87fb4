"""Rank health without a collective (issue 27): stalls, non-finite values and stragglers,
as pure logic with the clock passed in."""

from __future__ import annotations

import math

from wandb_funnel._logger.health import STRAGGLER_STEPS, Health, ranks_text
from wandb_funnel._logger.ordering import Row
from wandb_funnel._logger.reduce import RowBuilder


def _steps(health: Health, ranks: range, upto: int, t0: float = 0.0, dt: float = 0.1) -> float:
    now = t0
    for step in range(upto + 1):
        now = t0 + step * dt
        for rank in ranks:
            health.batch(rank, step, 1, now)
    return now


def test_a_rank_that_stops_while_the_others_wedge_is_named_once() -> None:
    """Ranks 0-2 reach step 30 and wait in a collective; rank 3 stopped at 29: after
    stall_timeout a report names rank 3 as behind, once; its resumption is said once."""
    health = Health(stall_timeout=10)
    for rank in range(4):
        health.attached(rank, 0.0)
    now = _steps(health, range(4), 29)
    for rank in range(3):
        health.batch(rank, 30, 1, now + 0.1)
    live = range(4)
    assert health.check(now + 5, live) is None
    found = health.check(now + 10.2, live)
    assert found is not None and found[0] == "stall"
    assert "rank 3 is behind: last step 29; ranks 0-2 at step 30" in found[1]
    assert "no progress for 10 s" in found[1]
    assert "rank 3: step 29" in found[1] and "rank 0: step 30" in found[1]
    assert health.check(now + 11, live) is None  # said once
    assert health.check(now + 30, live) is None
    health.batch(3, 30, 1, now + 31)
    assert health.check(now + 31.5, live) == ("resumed", "progress resumed after 21 s of stall")
    assert health.summary()["_funnel/stalls"] == 1
    assert "rank 3 is behind" in health.summary()["_funnel/last_stall"]


def test_a_silent_rank_while_the_others_advance() -> None:
    health = Health(stall_timeout=5)
    now = _steps(health, range(3), 10)
    for step in range(11, 80):  # ranks 0 and 1 go on, rank 2 is silent
        now += 0.1
        for rank in (0, 1):
            health.batch(rank, step, 1, now)
        found = health.check(now, range(3))
        if found is not None:
            break
    assert found is not None and found[0] == "stall"
    assert "rank 2 silent while the others advance" in found[1]
    assert "rank 2 is behind: last step 10" in found[1]


def test_a_rank_that_logged_once_is_never_silent() -> None:
    """An owner that logs its config at step 0 and leaves the steps to its workers."""
    health = Health(stall_timeout=5)
    health.batch(0, 0, 1, 0.0)
    now = 0.0
    for step in range(100):
        now = step * 0.1
        health.batch(1, step, 1, now)
        assert health.check(now, range(2)) is None


def test_a_dead_rank_or_a_zero_timeout_is_not_a_stall() -> None:
    health = Health(stall_timeout=5)
    _steps(health, range(2), 3)
    assert health.check(100.0, []) is None  # no live rank: nothing to say
    off = Health(stall_timeout=0)
    _steps(off, range(2), 3)
    assert off.check(100.0, range(2)) is None


def test_the_first_nan_of_each_rank_and_key_is_said_and_every_one_counted() -> None:
    health = Health(stall_timeout=0)
    assert health.values(1, 24, {"loss": 0.5, "n": 3}) == []
    said = health.values(1, 25, {"loss": math.nan, "x": {"y": math.inf}})
    assert said == [
        "rank 1 logged nan for 'loss' at step 25",
        "rank 1 logged inf for 'x.y' at step 25",
    ]
    assert health.values(1, 26, {"loss": math.nan}) == []  # counted, not said again
    assert health.values(2, 26, {"loss": -math.inf}) == ["rank 2 logged -inf for 'loss' at step 26"]
    assert health.summary()["_funnel/nonfinite"] == 4


def test_spread_writes_mean_min_max_and_their_ranks_and_finds_the_straggler() -> None:
    health = Health(stall_timeout=0)
    said: list[str] = []

    def on_spread(key: str, ranks: list[int], values: list[float], step: int) -> None:
        line = health.spread(key, ranks, values, step)
        if line:
            said.append(line)

    builder = RowBuilder("auto", {"step_time": "spread"}, "global_step", None, on_spread)
    for step in range(30):
        slow = 0.2 if step >= 10 else 0.0
        row = Row(step, {r: {"step_time": 0.1 + (slow if r == 2 else 0.0)} for r in range(4)})
        out = builder.build(row)
        if step >= 10:
            assert out["step_time/max_rank"] == 2 and out["step_time/max"] == 0.30000000000000004
            assert out["step_time/min_rank"] == 0 and out["step_time/min"] == 0.1
            assert math.isclose(out["step_time"], (0.1 * 3 + 0.3) / 4)
    assert len(said) == 1 and "rank 2 is a straggler" in said[0] and "3.00x the median" in said[0]
    assert f"for {STRAGGLER_STEPS} steps in a row" in said[0]
    assert health.summary()["_funnel/stragglers"] == [2]


def test_a_max_rank_that_changes_is_no_straggler() -> None:
    health = Health(stall_timeout=0)
    for step in range(50):
        slow = step % 4
        values = [0.3 if r == slow else 0.1 for r in range(4)]
        assert health.spread("t", [0, 1, 2, 3], values, step) is None
    assert health.summary()["_funnel/stragglers"] == []


def test_ranks_text() -> None:
    assert ranks_text([0, 1, 2, 5]) == "0-2, 5"
    assert ranks_text([3]) == "3"
    assert ranks_text([1, 2]) == "1, 2"
