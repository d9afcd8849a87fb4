"""The tiers of tests/tiers.py: every test the gate names exists, and the signal matrix's
gate cases cover every pair of values of the full matrix."""

from __future__ import annotations

import ast
import itertools
import pathlib

from tests.processes.test_signal_ownership import _cases
from tests.tiers import GATE, in_gate, pairwise_cover

TESTS = pathlib.Path(__file__).parent


def test_every_test_the_gate_names_exists() -> None:
    missing = []
    for entry in sorted(GATE):
        file, _, name = entry.partition("::")
        path = TESTS / file
        functions = (
            {
                n.name
                for n in ast.walk(ast.parse(path.read_text()))
                if isinstance(n, ast.FunctionDef)
            }
            if path.is_file()
            else set()
        )
        if name.split("[", 1)[0] not in functions:
            missing.append(entry)
    assert missing == []


def test_a_parameter_is_matched_exactly_and_a_bare_name_takes_every_parameter() -> None:
    assert in_gate("tests/processes/test_pool.py::test_pool_workers_log_every_step[fork]")
    assert in_gate(
        "tests/processes/test_ddp.py::test_mode_scope_matrix_on_two_nodes[auto-global-runs0]"
    )
    assert not in_gate(
        "tests/processes/test_ddp.py::test_mode_scope_matrix_on_two_nodes[shared-global-runs2]"
    )
    assert not in_gate("tests/processes/test_pool.py::test_share_run_pattern")


def test_the_signal_matrix_gate_is_a_pairwise_cover() -> None:
    cases = _cases()
    cover = pairwise_cover(cases)
    assert len(cover) < len(cases) / 2
    for i, j in itertools.combinations(range(len(cases[0])), 2):
        assert {(c[i], c[j]) for c in cover} == {(c[i], c[j]) for c in cases}, (i, j)
    assert pairwise_cover(cases) == cover  # the same cases every time
