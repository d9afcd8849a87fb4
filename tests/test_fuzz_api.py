"""Fuzzing the public API with hypothesis, against a real funnel (real logger, real ZeroMQ;
on the recording sink in the gate, and on real wandb offline in the full tier, where what a
call accepted must also be taken by wandb): whatever is passed to ``wf.log`` / ``Run.log`` /
``Run.summary`` / ``Run.config.update``, the call either succeeds or raises TypeError or
ValueError at the call site; nothing else escapes, nothing a call accepted is lost or refused
later, and the funnel keeps working.

Hypothesis runs inside tests/programs/fuzz_api.py, run by the ``scripts`` fixture: the funnel
is a real owner process with its logger (and wandb-core, on wandb), and the fixture checks
that none of them survive.
"""

from __future__ import annotations

import pytest

from tests.conftest import Scripts, program, reports
from tests.tiers import examples
from tests.wandb_reader import only_run, step_of

pytestmark = pytest.mark.processes

MAX_RECORD_BYTES = 20_000
# The gate runs a quarter of these (tests.tiers.examples); the thresholds below scale with it.
LOG_EXAMPLES = 700
UPDATE_EXAMPLES = 150
FINAL_STEP = 7

FUZZ_API = program("fuzz_api")  # the owner process: the funnel, and hypothesis inside it


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    "sink",
    [
        pytest.param("record", marks=pytest.mark.sink("record")),  # the funnel's API: the gate
        pytest.param("wandb", marks=pytest.mark.sink("wandb")),  # wandb takes what it accepted
    ],
)
def test_public_api_raises_only_type_or_value_errors_and_keeps_working(
    scripts: Scripts, sink: str
) -> None:
    """Random keys, values, nesting, sizes, steps (negative, huge, backwards, not ints) and
    commit flags through ``wf.log`` and ``Run.log``, and random summary and config updates:
    every call succeeds or raises TypeError/ValueError (anything else fails the scenario);
    every record a call accepted reaches the run (``_funnel/records`` is exactly the accepted
    calls plus the final good log, none dropped, one history row per accepted step); the
    final log, summary and config value land; no junk on the socket."""
    log_examples, update_examples = examples(LOG_EXAMPLES), examples(UPDATE_EXAMPLES)
    res = scripts.run_file(
        FUZZ_API,
        [
            "--max-record-bytes",
            str(MAX_RECORD_BYTES),
            "--log-examples",
            str(log_examples),
            "--update-examples",
            str(update_examples),
            "--final-step",
            str(FINAL_STEP),
        ],
        timeout=140,
    )
    assert res.returncode == 0, res.stderr[-6000:]
    assert res.leftovers == []
    info = reports(res.stdout)
    counts, stats = info["counts"], info["stats"]
    print(counts)
    # The fuzz really exercised both outcomes, and both step kinds.
    # (The floors are fractions of the examples run: 700 logs in the full tier need 20 of
    # each step kind and 100 refusals, 150 updates 10 of each outcome.)
    assert counts["log_ok"] + counts["log_refused"] >= 0.9 * log_examples
    assert counts["log_ok_implicit"] >= log_examples // 35
    assert counts["log_ok_explicit"] >= log_examples // 35
    assert counts["log_refused"] >= log_examples // 7
    assert counts["update_ok"] >= update_examples // 15
    assert counts["update_refused"] >= update_examples // 15
    # Self-containing or too deep data is refused with ValueError (log, summary, config),
    # and an implicit step past 2**63-1 is refused at the call site.
    assert info["odd"] == ["ValueError"] * 15 + ["refused"]

    run = only_run(scripts.wandb_dir)
    assert run.exit_code == 0
    assert stats["_funnel/records"] == counts["log_ok"] + 1  # + the final good log
    assert run.summary["_funnel/records"] == counts["log_ok"] + 1
    assert run.summary["_funnel/dropped_records"] == 0
    assert run.summary["_funnel/junk_frames"] == 0
    assert run.summary["_funnel/rejected_peers"] == 0
    # Every accepted record's step has a row: at its _step, or, late, under the step key.
    assert {step_of(row) for row in run.history} == set(info["ok_steps"])
    assert [(step_of(r), r["final_ok"]) for r in run.history if "final_ok" in r] == [
        (FINAL_STEP, 1)
    ]
    assert run.summary["final_summary"] == 2
    assert run.config["final_config"] == 3
