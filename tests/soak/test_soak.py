"""The short soak CI runs: every scenario of the fault matrix, a few randomized iterations
each, with every check the long soak makes (``wandb-funnel soak`` / ``tox -e soak``)."""

from __future__ import annotations

import os
import pathlib

import pytest

from wandb_funnel.soak.harness import run_iteration
from wandb_funnel.soak.scenarios import SCENARIOS, Scenario

pytestmark = [pytest.mark.soak, pytest.mark.processes]

ITERATIONS = int(os.environ.get("WANDB_FUNNEL_SOAK_ITERATIONS", "2"))
SEED = os.environ.get("WANDB_FUNNEL_SOAK_SEED", "ci")


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_scenario(scenario: Scenario, tmp_path: pathlib.Path,
                  request: pytest.FixtureRequest) -> None:
    for module in scenario.needs:
        pytest.importorskip(module)
    # Hangs fail inside the harness (a deadline per iteration); this only backs it up.
    request.node.add_marker(pytest.mark.timeout(ITERATIONS * (scenario.deadline + 40)))
    failures = []
    for index in range(1, ITERATIONS + 1):
        it = run_iteration(scenario, index, tmp_path, f"{SEED}-{scenario.name}-{index}")
        if not it.ok:
            failures.append(f"iteration {index} (seed {it.seed}): {it.problems}")
        assert it.sent > 0, "the program logged nothing: the scenario tested nothing"
        if scenario.fault is not None:
            assert it.fault_done, "the fault was never injected"
    assert not failures, "\n".join(failures)
