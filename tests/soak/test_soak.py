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
    request.node.add_marker(pytest.mark.timeout(3 * ITERATIONS * (scenario.deadline + 40)))
    failures, tested, tries, sent = [], 0, 0, 0
    # An iteration whose program ended before its fault was due tested nothing about the
    # fault: it still has to pass every other check, and another iteration is run instead.
    while tested < ITERATIONS and tries < 3 * ITERATIONS:
        tries += 1
        it = run_iteration(scenario, tries, tmp_path, f"{SEED}-{scenario.name}-{tries}")
        if not it.ok:
            failures.append(f"iteration {tries} (seed {it.seed}): {it.problems}")
        sent += it.sent
        tested += scenario.fault is None or it.fault_done
    assert not failures, "\n".join(failures)
    assert sent > 0, "the program logged nothing: the scenario tested nothing"
    assert tested == ITERATIONS, f"the fault landed in only {tested} of {tries} iterations"
