"""The short soak CI runs: every scenario of the project's fault matrix (``soak/scenarios.py``
in the repository), a few randomized iterations each, with every check the long soak makes
(``wandb-funnel soak --matrix soak/scenarios.py`` / ``tox -e soak``)."""

from __future__ import annotations

import os
import pathlib

import pytest

from wandb_funnel.soak.harness import run_iteration
from wandb_funnel.soak.scenarios import Scenario, load_matrix

MATRIX = pathlib.Path(__file__).resolve().parents[2] / "soak" / "scenarios.py"
SCENARIOS = load_matrix(MATRIX)

# Iterations a scenario: WANDB_FUNNEL_SOAK_ITERATIONS, else 2 in the full tier and 1 for the
# gate's scenario (the gate runs each mechanism once; the full tier is for more of the same).
ITERATIONS = int(os.environ.get("WANDB_FUNNEL_SOAK_ITERATIONS", "2"))
# Hangs fail inside the harness (a deadline per iteration, then it reports and kills); the
# test's own timeout must outlast those deadlines (a timeout marker added inside the test
# body would be read too late to count).
_LIMIT = 3 * ITERATIONS * (max(s.deadline for s in SCENARIOS) + 40)
pytestmark = [pytest.mark.soak, pytest.mark.processes, pytest.mark.timeout(_LIMIT)]
SEED = os.environ.get("WANDB_FUNNEL_SOAK_SEED", "ci")


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_scenario(
    scenario: Scenario, tmp_path: pathlib.Path, request: pytest.FixtureRequest
) -> None:
    for module in scenario.needs:
        pytest.importorskip(module)
    iterations = ITERATIONS
    if "WANDB_FUNNEL_SOAK_ITERATIONS" not in os.environ and not request.node.get_closest_marker(
        "full"
    ):
        iterations = 1
    failures, tested, tries, sent = [], 0, 0, 0
    # An iteration whose program ended before its fault was due tested nothing about the
    # fault: it still has to pass every other check, and another iteration is run instead.
    while tested < iterations and tries < 3 * iterations:
        tries += 1
        it = run_iteration(scenario, tries, tmp_path, f"{SEED}-{scenario.name}-{tries}")
        if not it.ok:
            failures.append(f"iteration {tries} (seed {it.seed}): {it.problems}")
            _print_tails(pathlib.Path(it.directory))
        sent += it.sent
        # A dependency's known crash (Scenario.known_abort) tested nothing about us either.
        tested += not it.known_abort and (
            scenario.fault is None or (it.fault_done and not it.fault_after_end)
        )
    assert not failures, "\n".join(failures)
    assert sent > 0, "the program logged nothing: the scenario tested nothing"
    assert tested == iterations, f"the fault landed in only {tested} of {tries} iterations"


def _print_tails(directory: pathlib.Path, limit: int = 6000) -> None:
    """A failed iteration's output, for pytest's captured-stdout section: CI keeps no files,
    and an exit code alone (say, -6) does not say which process aborted or why."""
    for name in ("stderr.txt", "stdout.txt", "hang-stacks.txt"):
        path = directory / name
        if path.exists():
            text = path.read_bytes()[-limit:].decode(errors="replace")
            print(f"----- {directory.name}/{name} (last {limit} bytes) -----\n{text}")
