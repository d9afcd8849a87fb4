"""Signal ownership, held by a matrix of cases (the contract: docs/guide/lifecycle.md, signals).

A handler installed before the funnel attaches is chained; one installed later stays the
installed one. Either runs once per signal, and the exit code it chooses is the process's,
wherever the signal lands: inside a batch send, inside ``finish()``, inside the funnel's exit
hooks. ``SIG_DFL`` still kills, ``SIG_IGN`` still ignores, ``default_int_handler`` still
raises ``KeyboardInterrupt``; and every record logged before the signal is in the run.

Each case is tests/programs/signal_ownership.py, run in a fresh process tree;
``WANDB_FUNNEL_TEST_REPEAT=N`` runs each case N times in a row (these are races).
"""

from __future__ import annotations

import os
import pathlib
import signal
from typing import Any

import pytest

from tests.conftest import Scripts, reports
from tests.tiers import pairwise_cover
from tests.wandb_reader import find_runs
from wandb_funnel._constants import BATCH_RECORDS

PROGRAM = pathlib.Path(__file__).parent.parent / "programs" / "signal_ownership.py"
STEPS = BATCH_RECORDS + 20  # as in the program
HANDLER_EXIT = 42
REPEAT = int(os.environ.get("WANDB_FUNNEL_TEST_REPEAT", "1"))
# Each case's time limit grows with its repeats (pyproject's timeout is for one run).
pytestmark = [pytest.mark.processes, pytest.mark.sink("record"), pytest.mark.timeout(120 * REPEAT)]
LANDS = ("training", "finish", "exit")


def _cases() -> list[tuple[str, str, str, str, str, str]]:
    """(role, method, handler, when, land, sig)"""
    cases = []
    for when in ("before-init", "after-init", "after-log", "dataloader"):
        for land in LANDS:
            for sig in ("TERM", "INT"):
                cases.append(("owner", "-", "user", when, land, sig))
    for land in LANDS:
        for sig in ("TERM", "INT"):
            cases.append(("owner", "-", "default", "after-init", land, sig))
    cases.append(("owner", "-", "ignore", "after-init", "training", "TERM"))
    for method in ("spawn", "fork", "forkserver"):
        for when in ("before-init", "after-log"):
            for land in LANDS:
                for sig in ("TERM", "INT"):
                    cases.append(("worker", method, "user", when, land, sig))
        cases.append(("worker", method, "default", "after-init", "training", "TERM"))
    for land in ("finish", "exit"):
        cases.append(("worker", "spawn", "default", "after-init", land, "TERM"))
    # The batch numbered and parked when the signal lands: the handler's finish() sends it.
    for when in ("before-init", "after-log"):
        for sig in ("TERM", "INT"):
            cases.append(("owner", "-", "user", when, "send", sig))
    for method in ("spawn", "fork", "forkserver"):
        cases.append(("worker", method, "user", "after-log", "send", "TERM"))
    # A handler that returns (Lightning's flag): training goes on, nothing is lost.
    for land in ("training", "send", "finish", "exit"):
        cases.append(("owner", "-", "flag", "after-log", land, "TERM"))
    cases.append(("worker", "fork", "flag", "after-log", "training", "TERM"))
    # A handler installed before the funnel, then a composer (Lightning's connector) that
    # calls what it found: the funnel's hook, which must still run the first handler.
    for land in ("training", "send", "finish", "exit"):
        cases.append(("owner", "-", "chain", "after-log", land, "TERM"))
    cases.append(("worker", "spawn", "chain", "after-log", "training", "TERM"))
    return cases


def _expected_exit(role: str, handler: str, land: str, sig: str) -> int:
    """The exit status the process would have with no funnel in it, the signal landing at
    the same point of the program (the funnel only makes it wait for the flush)."""
    if handler in ("user", "chain"):
        return HANDLER_EXIT
    if handler in ("ignore", "flag"):
        return 0
    if sig == "TERM":
        return -signal.SIGTERM
    # default_int_handler: KeyboardInterrupt. A multiprocessing child reports it as 1; a
    # main process ends by SIGINT, as CPython does on an uncaught one.
    return 1 if role == "worker" else -signal.SIGINT


def _tiered_cases() -> list[Any]:
    """Every case; the gate runs a pairwise cover of them (every pair of values of any two
    dimensions that the matrix has, so every handler x landing pair), the full tier all."""
    cases = _cases()
    cover = set(pairwise_cover(cases))
    return [pytest.param(*c, marks=[pytest.mark.gate] if c in cover else []) for c in cases]


@pytest.mark.parametrize(
    ("role", "method", "handler", "when", "land", "sig"),
    _tiered_cases(),
    ids=str,
)
def test_signal_ownership(
    scripts: Scripts, role: str, method: str, handler: str, when: str, land: str, sig: str
) -> None:
    if when == "dataloader":
        pytest.importorskip("torch")
    for attempt in range(REPEAT):
        wandb_dir = scripts.tmp_path / f"attempt{attempt}"
        wandb_dir.mkdir()
        scripts.wandb_dir = wandb_dir
        args = ["--role", role, "--handler", handler, "--when", when, "--land", land, "--sig", sig]
        if role == "worker":
            args += ["--method", method]
        res = scripts.run_file(PROGRAM, args, timeout=90)
        where = f"attempt {attempt}: rc={res.returncode}\n{res.stdout}\n{res.stderr[-3000:]}"
        info = reports(res.stdout)
        handler_lines = [ln for ln in res.stdout.splitlines() if '"handler"' in ln]
        composer_lines = [ln for ln in res.stdout.splitlines() if '"composer"' in ln]
        ends_process = handler not in ("ignore", "flag")  # the signal ends the process
        expected = _expected_exit(role, handler, land, sig)

        if role == "owner":
            assert res.returncode == expected, where
        else:
            assert res.returncode == 0, where
            assert info["child_exitcode"] == expected, where
            assert info["stats"]["_funnel/dropped_records"] == 0, where
        # The user's handler: installed where they put it, run exactly once.
        if handler in ("user", "flag", "chain"):
            # Installed after the funnel: still the installed one. Before: ours chains it.
            chained = when == "before-init" and sig == "TERM"
            assert info.get("installed") is not chained, where
            if "installed_end" in info:  # still theirs after finish() / close()
                assert info["installed_end"] is not chained, where
            assert len(handler_lines) == 1, where
            assert len(composer_lines) == (1 if handler == "chain" else 0), where
        else:
            assert info.get("fired") == land, where  # the signal was sent, and did nothing
            assert handler_lines == [], where
        # Every record logged before the signal is in the run; the run is finished.
        runs = find_runs(wandb_dir)
        assert len(runs) == 1, where
        run = runs[0]
        early = land in ("training", "send") and ends_process  # ended inside a log()
        logged = BATCH_RECORDS if early else STEPS
        assert [s for s, _ in run.column("c")] == list(range(logged)), where
        assert run.summary["_funnel/dropped_records"] == 0, where
        assert run.exit_code is not None, where
        if role == "owner" and handler == "default" and land in ("training", "send"):
            assert run.exit_code == (143 if sig == "TERM" else 130), where
        else:
            assert run.exit_code == 0, where
        assert res.leftovers == [], where
