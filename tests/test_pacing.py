"""``_logger/pacing.py``: work paced to a share of the time, within a floor and a ceiling."""

from __future__ import annotations

import time

from wandb_funnel._logger.pacing import Pacer


def test_a_costly_run_waits_its_share_and_never_past_the_ceiling() -> None:
    pacer = Pacer(0.5, floor=0.0, ceiling=5.0)
    assert pacer.due(0.0)
    began = time.monotonic() - 0.1  # it took 0.1 s: the next in 0.2 s at half the time
    pacer.ran(10.0, began)
    assert not pacer.due(10.15) and pacer.due(10.3)
    pacer.ran(20.0, time.monotonic() - 100.0)  # 100 s: capped at the ceiling
    assert not pacer.due(24.9) and pacer.due(25.0)


def test_a_cheap_run_waits_the_floor() -> None:
    pacer = Pacer(0.03, floor=1.0)
    pacer.ran(0.0, time.monotonic())
    assert not pacer.due(0.9) and pacer.due(1.0)
