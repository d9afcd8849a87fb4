"""The funnel on whichever wandb is installed (0.22 and later): what differs between
releases (``sinks/wandb/compat.py``) still reaches the run, read back from wandb's own file,
and what the installed wandb lacks is said once and counted. ``tox -e wandb-oldest`` and
``tox -e wandb-newest`` run this (with the whole gate) on the oldest and the newest wandb."""

from __future__ import annotations

import pytest
import wandb
from wandb.sdk import wandb_run

from tests.conftest import Scripts, program, reports
from tests.wandb_reader import only_run

pytestmark = [pytest.mark.processes]
VERSIONS = program("versions")
# What this wandb lacks, by feature, as compat.py checks it: the lines the logger says.
LACKS = [
    name
    for name, has in [
        (
            "setting x_transaction_log_flush_interval",
            "x_transaction_log_flush_interval" in wandb.Settings.model_fields,
        ),
    ]
    if not has
]


def test_this_wandb_gets_every_ranks_rows_console_metrics_and_files(scripts: Scripts) -> None:
    res = scripts.run_file(VERSIONS, [])
    assert res.returncode == 0, res.stderr
    info = reports(res.stdout)
    assert info["exitcodes"] == [0, 0]
    run = only_run(scripts.wandb_dir)
    # Rows: each step once, every rank's keys in it.
    assert [row["_step"] for row in run.history] == list(range(5))
    for row in run.history:
        assert {"owner", "loss", "w1", "w2"} <= set(row), row
    assert run.summary["loss"] == {"min": pytest.approx(0.2)}
    # Console: through Run._interface (0.26.1 and later) or Run._backend.interface.
    text = "".join(r.get("line", "") for r in run.output_raw)
    for who in ("worker 1", "worker 2"):
        assert f"{who} says hello" in text, text
    assert run.summary["_funnel/dropped_console_lines"] == 0
    # System metrics of each rank, labelled (publish_stats, the same interface).
    labels = {k.split("/l:")[1] for item in run.stats for k in item if "/l:" in k}
    assert {lab.split("-")[0] for lab in labels} >= {"rank1", "rank2"}, labels
    # Files: a literal name (glob=False; escaped for a wandb whose save has no glob) and a glob.
    assert {"weird[1].txt", "ckpt/a.bin", "ckpt/b.bin"} <= set(run.files), run.files
    assert run.summary["_funnel/dropped_files"] == 0
    # What this wandb lacks: said once each, and counted.
    assert run.summary["_funnel/wandb_degraded"] == len(LACKS)
    for name in LACKS:
        assert res.stderr.count(f"has no {name}") == 1, res.stderr
    assert "has no " not in res.stderr or LACKS, res.stderr
    assert run.exit_code == 0


def test_define_metric_goal_fails_at_the_call_where_plain_wandb_refuses_it(
    scripts: Scripts,
) -> None:
    """wandb 0.29 dropped define_metric's ``goal``: plain wandb raises TypeError at the
    call, and so does the funnel's rank; before 0.29 both take it."""
    takes_goal = "goal" in __import__("inspect").signature(wandb_run.Run.define_metric).parameters
    res = scripts.run_file(VERSIONS, ["--goal"])
    assert res.returncode == 0, res.stderr
    info = reports(res.stdout)
    assert info["goal_refused"] is (not takes_goal), info
    run = only_run(scripts.wandb_dir)
    if takes_goal:
        assert any(m.get("goal") for m in run.metrics), run.metrics
    assert "refused a define metric" not in res.stderr, res.stderr
