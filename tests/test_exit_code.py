"""The run's exit code from the owner's and the ranks' (pure logic; end-to-end in the soak's
torchrun scenarios and tests/processes/test_ddp.py)."""

from __future__ import annotations

import pytest

from wandb_funnel._logger.loop import run_exit_code


@pytest.mark.parametrize(
    ("owner", "ranks", "expected"),
    [
        (0, [], 0),  # everyone finished
        (0, [1], 1),  # a rank raised while the owner ended cleanly
        (0, [143, 1], 1),  # a rank was stopped because another raised: the raise is the cause
        (1, [], 1),  # the owner raised
        (143, [], 143),  # preemption: only the owner's code is known
        (143, [143, 143], 143),  # preemption reached every rank
        (143, [1], 1),  # torchrun SIGTERMed the owner because rank 1 raised
        (130, [143, 1, 2], 1),  # the first non-signal failure is the cause
        (1, [143], 1),  # the owner's own failure stands
        (2, [1], 2),
    ],
)
def test_run_exit_code(owner: int, ranks: list[int], expected: int) -> None:
    assert run_exit_code(owner, ranks) == expected
