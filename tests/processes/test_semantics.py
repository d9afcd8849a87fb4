"""What ends up in the run: reduction across ranks, shared-mode keys, rare ranks, late
records, config and summary from workers, bad input at the call site, junk on the socket."""

from __future__ import annotations

import pytest

from tests.conftest import Scripts, program, reports
from tests.wandb_reader import only_run

pytestmark = [pytest.mark.processes, pytest.mark.sink("record")]  # the funnel's semantics

SEMANTICS = program("semantics")  # the owner process of each scenario below


def test_auto_mode_reduces_like_all_gather(scripts: Scripts) -> None:
    """auto: loss logged by every rank is the mean per step (what an all_gather mean gives),
    tput is summed as asked, and a key logged by one rank appears untouched."""
    res = scripts.run_file(SEMANTICS, ["auto-mode"])
    assert res.returncode == 0, res.stderr
    assert reports(res.stdout)["codes"] == [0, 0, 0]
    run = only_run(scripts.wandb_dir)
    assert [r["_step"] for r in run.history] == list(range(20))
    for row in run.history:
        s = row["_step"]
        assert row["loss"] == pytest.approx(sum(r * 10 + s for r in (1, 2, 3)) / 3)
        assert row["tput"] == 3.0
        assert row["only2"] == s
    assert run.summary["_funnel/late_records"] == 0
    assert run.summary["_funnel/ranks"] == 3


def test_shared_mode_keeps_every_rank(scripts: Scripts) -> None:
    """shared: every rank's value appears as {key}/rank{rank}, plus the reductions asked for."""
    res = scripts.run_file(SEMANTICS, ["shared-mode"])
    assert res.returncode == 0, res.stderr
    run = only_run(scripts.wandb_dir)
    for row in run.history:
        s = row["_step"]
        assert row["loss/rank1"] == 10 + s and row["loss/rank2"] == 20 + s
        assert row["loss"] == 20 + s
        assert "tput" not in row and row["tput/rank1"] == 1.0


def test_rare_rank_lands_at_its_steps_without_stalling(scripts: Scripts) -> None:
    """A rank logging every 50 steps while others log every step: its records land at their
    own steps, merged into those rows, and nothing is late. (The window is wide so that a
    descheduled process on a loaded CI machine cannot make this timing-dependent.)"""
    res = scripts.run_file(SEMANTICS, ["rare-rank"])
    assert res.returncode == 0, res.stderr
    run = only_run(scripts.wandb_dir)
    assert [r["_step"] for r in run.history] == list(range(200))
    assert run.column("only3") == [(0, 0), (50, 50), (100, 100), (150, 150)]
    assert run.summary["_funnel/late_records"] == 0


@pytest.mark.sink("wandb")  # what wandb wrote is checked
def test_late_record_is_logged_at_its_step_and_counted(scripts: Scripts) -> None:
    """A record that arrives after its row was written is still logged at its x (the step
    key), not dropped by wandb's step rule, and counted as late."""
    res = scripts.run_file(SEMANTICS, ["late-record"])
    assert res.returncode == 0, res.stderr
    run = only_run(scripts.wandb_dir)
    assert run.column("late", "global_step") == [(5, 5)]  # its own step, kept
    assert run.summary["_funnel/late_records"] == 1
    assert run.summary["_funnel/records"] == 21
    steps = [r["_step"] for r in run.history]
    assert steps == list(range(21))  # the late row at the next free step
    # Only the late row carries the step key; no axis of the funnel's is declared.
    assert [r for r in run.history if "global_step" in r] == [run.history[20]]
    assert run.metrics == []


def test_worker_config_and_summary_reach_the_run(scripts: Scripts) -> None:
    res = scripts.run_file(SEMANTICS, ["worker-config-and-summary"])
    assert res.returncode == 0, res.stderr
    run = only_run(scripts.wandb_dir)
    assert run.config["owner"] == "yes" and run.config["worker_seed"] == 7
    assert run.config["lr"] == 0.01
    assert run.summary["worker_best"] == 0.9


def test_bad_input_raises_at_call_site_and_funnel_keeps_working(scripts: Scripts) -> None:
    """Bad log() calls raise TypeError/ValueError naming the problem; later logs still land."""
    res = scripts.run_file(SEMANTICS, ["bad-input"])
    assert res.returncode == 0, res.stderr
    errors = reports(res.stdout)["errors"]
    assert len(errors) == 6
    assert "keys must be str" in errors[0]
    assert "'k'" in errors[1] and "'k'" in errors[2]
    assert "must be a dict" in errors[3]
    assert "max_record_bytes=1000" in errors[4]
    assert "step" in errors[5]
    run = only_run(scripts.wandb_dir)
    assert run.column("child_ok") == [(0, 1)] and run.column("owner_ok") == [(0, 1)]
    assert run.summary["_funnel/dropped_records"] == 0


def test_junk_on_the_socket_is_counted_and_survived(scripts: Scripts) -> None:
    """Malformed frames, frames from a peer that never said hello, and a hello with the wrong
    token are counted and skipped; the logger keeps serving real ranks."""
    res = scripts.run_file(SEMANTICS, ["junk-on-the-socket"])
    assert res.returncode == 0, res.stderr
    stats = reports(res.stdout)["stats"]
    assert stats["_funnel/junk_frames"] == 4
    assert stats["_funnel/rejected_peers"] == 1
    run = only_run(scripts.wandb_dir)
    assert run.column("before") == [(0, 1)] and run.column("after") == [(1, 1)]
    assert "evil" not in {k for row in run.history for k in row}
