"""Every exit path ends in bounded time, finishes the run with the right exit code, loses
nothing it could have kept, and leaves no process or socket file behind."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from tests.conftest import Scripts, program, reports, wait_for_report
from tests.wandb_reader import only_run
from wandb_funnel._constants import BATCH_RECORDS

# The funnel's own exit paths, read back from the recording sink; the tests of wandb-core's
# part (a stalled or orphaned wandb-core, what it flushed before a crash, its write rate)
# run on wandb.
pytestmark = [pytest.mark.processes, pytest.mark.sink("record")]

LIFECYCLE = program("lifecycle")  # the owner process of every scenario below


def test_exception_in_block_exits_1(scripts: Scripts) -> None:
    """An exception leaving the with-block finishes the run with exit code 1, after draining."""
    res = scripts.run_file(LIFECYCLE, ["exception-in-block"])
    assert res.returncode == 1 and "boom" in res.stderr
    run = only_run(scripts.wandb_dir)
    assert run.exit_code == 1
    assert [r["_step"] for r in run.history] == list(range(50))
    assert res.leftovers == []


@pytest.mark.parametrize("code", [0, 3, 143])
def test_the_logger_process_exits_with_the_runs_exit_code(scripts: Scripts, code: int) -> None:
    """The logger's exit code is the code it finished the run with (it used to be 0 always)."""
    res = scripts.run_file(LIFECYCLE, ["close-with-code", "--code", str(code)])
    assert res.returncode == 0, res.stderr
    assert reports(res.stdout) == {"logger_exit": code, "run_exit": code}
    assert only_run(scripts.wandb_dir).exit_code == code
    assert res.leftovers == []


@pytest.mark.parametrize(
    ("ending", "code"),
    [("pass", 0), ("raise", 1), ("exit", 3)],  # raise ValueError; sys.exit(3)
)
def test_no_close_atexit(scripts: Scripts, ending: str, code: int) -> None:
    """Without close(), interpreter exit drains and finishes the run with the right code."""
    res = scripts.run_file(LIFECYCLE, ["no-close-atexit", "--ending", ending])
    run = only_run(scripts.wandb_dir)
    assert run.exit_code == code
    assert len(run.history) == 30
    assert res.leftovers == []


def test_private_funnel_is_like_wandb_init(scripts: Scripts) -> None:
    """wf.init() with no funnel around owns a private one; finish() ends the run."""
    res = scripts.run_file(LIFECYCLE, ["private-funnel-is-like-wandb-init"])
    assert res.returncode == 0, res.stderr
    info = reports(res.stdout)
    run = only_run(scripts.wandb_dir)
    assert info["rank"] == 0 and info["id"] == run.run_id
    assert info["after_env"] is None
    rows = [{k: v for k, v in r.items() if k == "_step" or k[0] != "_"} for r in run.history]
    # wandb's step rules per rank: commit=False accumulates; an explicit step stays open.
    assert rows == [
        {"a": 1, "_step": 0},
        {"a": 2, "b": 3, "_step": 1},
        {"c": 5, "d": 6, "_step": 5},
    ]
    assert run.summary["best"] == 9
    assert run.config["lr"] == 0.5 and run.config["extra"] is True


@pytest.mark.parametrize("target", ["owner", "group"])
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_mid_run(scripts: Scripts, target: str, signum: int, code: int) -> None:
    """Ctrl-C (SIGINT) or SIGTERM (a scheduler, torchrun's killpg), to the owner or to its
    whole process group: the run is drained and finished with 130 / 143, the owner still
    ends the way the signal would have ended it, workers' records are kept, and everything
    exits in bounded time."""
    proc = scripts.start_file(LIFECYCLE, ["signal-mid-run"])
    t0 = time.monotonic()
    wait_for_report(proc, "ready")
    time.sleep(0.5)
    if target == "owner":
        proc.send_signal(signum)
    else:
        os.killpg(proc.pid, signum)
    res = scripts.finish(proc, 60, t0)
    if signum == signal.SIGINT:
        assert res.returncode != 0 and "KeyboardInterrupt" in res.stderr
    else:
        assert res.returncode == -signal.SIGTERM
    run = only_run(scripts.wandb_dir)
    assert run.exit_code == code
    assert run.summary["_funnel/records"] > 0
    if target == "group" and signum == signal.SIGTERM:
        # Workers flushed on their own SIGTERM: both ranks' records are in the run.
        assert {v for _, v in run.column("w")} == {0, 1}
    assert res.leftovers == []


@pytest.mark.parametrize("own_handler", [False, True])
def test_worker_keeps_its_signal_disposition(scripts: Scripts, own_handler: bool) -> None:
    """SIGTERM is never swallowed: a worker that would die of it still dies of it, and a
    worker's own handler still runs (here it exits with 7); either way the records it logged
    before the signal are flushed into the run first."""
    res = scripts.run_file(
        LIFECYCLE,
        ["worker-keeps-its-signal-disposition", *(["--own-handler"] if own_handler else [])],
    )
    assert res.returncode == 0, res.stderr
    assert reports(res.stdout)["exitcode"] == (7 if own_handler else -signal.SIGTERM)
    run = only_run(scripts.wandb_dir)
    assert [s for s, _ in run.column("c")] == list(range(100))


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_sigterm_that_misses_the_main_thread_still_runs_its_handler(
    scripts: Scripts, method: str
) -> None:
    """CPython runs a Python handler only on the main thread, at its next bytecode or EINTR.
    A SIGTERM taken by another thread while the main thread sleeps in sem_wait (a Pool worker
    idle in SimpleQueue.get() when Pool.terminate() signals it) used to leave the handler
    pending forever, and terminate() hung. Here the signal goes to a helper thread on
    purpose: the worker must still flush its records and die of SIGTERM."""
    res = scripts.run_file(LIFECYCLE, ["sigterm-that-misses-the-main-thread", "--method", method])
    assert res.returncode == 0, res.stderr
    assert reports(res.stdout)["exitcode"] == -signal.SIGTERM
    run = only_run(scripts.wandb_dir)
    assert [s for s, _ in run.column("c")] == list(range(50))
    assert res.leftovers == []


@pytest.mark.parametrize("chained", [False, True])
def test_sigterm_during_a_batch_send_loses_nothing(scripts: Scripts, chained: bool) -> None:
    """SIGTERM whose handler would run in the middle of a batch send (here it is raised from
    inside the send, at the worst moment): the batch still goes out before the shutdown, so
    every record logged reaches the run and none is counted as dropped. A handler the user
    installed after ours, chaining to it (Lightning, submitit), runs exactly once and decides
    how the process ends: ours, called by it, only flushes."""
    res = scripts.run_file(
        LIFECYCLE, ["sigterm-during-a-batch-send", *(["--chained"] if chained else [])]
    )
    assert res.returncode == 0, res.stderr
    info = reports(res.stdout)
    assert info["exitcode"] == (143 if chained else -signal.SIGTERM)
    run = only_run(scripts.wandb_dir)
    # The SIGTERM landed at the batch's last log(): that whole batch was logged, then it died.
    assert [s for s, _ in run.column("c")] == list(range(BATCH_RECORDS))
    assert run.summary["_funnel/dropped_records"] == 0
    assert res.stdout.count("USER_HANDLER") == (1 if chained else 0)
    assert res.leftovers == []


def test_close_waits_for_a_straggler(scripts: Scripts) -> None:
    """close() waits (bounded) for a rank still logging, so its last records are not cut."""
    res = scripts.run_file(LIFECYCLE, ["close-waits-for-a-straggler"])
    assert res.returncode == 0, res.stderr
    run = only_run(scripts.wandb_dir)
    assert [s for s, _ in run.column("c")] == list(range(40))
    assert run.summary["_funnel/dropped_records"] == 0


def test_dead_worker_is_not_waited_for(scripts: Scripts) -> None:
    """A worker SIGKILLed mid-run is noticed: close() does not wait on it, the run's exit code
    stays the owner's (0), and the death is counted in the summary."""
    res = scripts.run_file(LIFECYCLE, ["dead-worker-is-not-waited-for"])
    assert res.returncode == 0, res.stderr
    info = reports(res.stdout)
    assert info["close_s"] < 15  # well below the 15 s a straggler could get
    run = only_run(scripts.wandb_dir)
    assert run.exit_code == 0
    assert run.summary["_funnel/dead_ranks"] == 1
    assert [s for s, _ in run.column("c")] == list(range(10))
    assert "died without finishing" in res.stderr


def test_logger_death_does_not_fail_training(scripts: Scripts) -> None:
    """If the logger dies, training goes on: the owner starts a new one that continues the
    run, and the run has every row (tests/processes/test_restart.py: every kind of death)."""
    res = scripts.run_file(LIFECYCLE, ["logger-death-does-not-fail-training"])
    assert res.returncode == 0, res.stderr
    assert reports(res.stdout)["trained"]
    assert "starting a new one" in res.stderr and "took over" in res.stderr
    assert [row["x"] for row in only_run(scripts.wandb_dir).history] == list(range(5000))
    assert res.leftovers == []


def test_logger_death_without_restarts_warns_what_was_lost(scripts: Scripts) -> None:
    """max_logger_restarts=0: training goes on, the owner exits with its own status, and a
    warning says what was lost; nothing hangs."""
    res = scripts.run_file(
        LIFECYCLE, ["logger-death-does-not-fail-training", "--max-restarts", "0"]
    )
    assert res.returncode == 0, res.stderr
    assert reports(res.stdout)["trained"]
    assert "logger" in res.stderr and "exited" in res.stderr
    assert "starting a new one" not in res.stderr
    assert res.elapsed < 60
    assert res.leftovers == []


@pytest.mark.sink("wandb")
def test_owner_killed_logger_exits_by_itself(scripts: Scripts) -> None:
    """SIGKILL to the owner: the logger notices and exits by itself, removing the socket
    directory; no process of the job is left. wandb-core exits with its parent (the owner),
    so the run keeps what wandb flushed (all rows logged over a second before the kill) and
    has no exit record: the documented cost of a hard kill of the owner."""
    proc = scripts.start_file(LIFECYCLE, ["owner-killed"])
    t0 = time.monotonic()
    info = wait_for_report(proc, "logger_pid")
    proc.kill()
    res = scripts.finish(proc, 30, t0)
    logger = info["logger_pid"]
    deadline = time.monotonic() + 30
    while psutil.pid_exists(logger) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not psutil.pid_exists(logger) or psutil.Process(logger).status() == "zombie"
    run = only_run(scripts.wandb_dir)
    assert [r["_step"] for r in run.history] == list(range(100))
    assert not os.path.exists(os.path.dirname(info["address"][len("ipc://") :]))
    assert res.leftovers == []


@pytest.mark.sink("wandb")
def test_stalled_wandb_finish_is_bounded(scripts: Scripts) -> None:
    """If wandb-core stalls (SIGSTOPped), close() still returns within close_timeout plus
    the kill grace, kills the logger and warns that the run may be incomplete."""
    res = scripts.run_file(LIFECYCLE, ["stalled-wandb-finish"])
    assert res.returncode == 0, res.stderr
    info = reports(res.stdout)
    assert info["cores"] >= 1
    assert info["close_s"] < 3 + 2 * 2 + 1  # close_timeout + terminate/kill grace + slack
    assert "did not finish the run within close_timeout" in res.stderr
    assert res.leftovers == []


@pytest.mark.sink("wandb")
def test_logger_crash_loses_at_most_a_second(scripts: Scripts) -> None:
    """With the short transaction-log flush, rows written >1 s before a logger SIGKILL are
    on disk (wandb's default would keep them in memory for up to 15 s)."""
    res = scripts.run_file(LIFECYCLE, ["logger-crash-loses-at-most-a-second"])
    assert res.returncode == 0, res.stderr
    run = only_run(scripts.wandb_dir)
    assert [r["_step"] for r in run.history] == list(range(200))


def test_funnels_one_after_another_in_one_process(scripts: Scripts) -> None:
    """A process can own one funnel after another: each run is complete, and the flusher
    thread serves the second funnel too (a part-filled batch leaves within 0.1 s)."""
    res = scripts.run_file(LIFECYCLE, ["funnels-one-after-another"])
    assert res.returncode == 0, res.stderr
    assert reports(res.stdout)["pending"] == [0, 0]
    from tests.wandb_reader import find_runs

    runs = find_runs(scripts.wandb_dir)
    assert len(runs) == 2
    assert sorted(len(r.history) for r in runs) == [3, 3]
    assert all(r.exit_code == 0 for r in runs)
    assert res.leftovers == []


def test_backlog_at_exit_is_delivered_or_counted(scripts: Scripts) -> None:
    """Workers that log a burst and exit at once leave the logger behind: every record still
    ends up in the run or counted as dropped, and no finished rank is mistaken for dead."""
    res = scripts.run_file(LIFECYCLE, ["backlog-at-exit"], timeout=150)
    assert res.returncode == 0, res.stderr
    info = reports(res.stdout)
    stats = info["stats"]
    assert info["codes"] == [0, 0, 0]
    assert stats["_funnel/records"] + stats["_funnel/dropped_records"] == 90000
    assert stats["_funnel/dead_ranks"] == 0
    assert "died without finishing" not in res.stderr
    run = only_run(scripts.wandb_dir)
    assert run.summary["_funnel/records"] == stats["_funnel/records"]


@pytest.mark.sink("wandb")
def test_logger_watchdog_when_owner_dies_and_wandb_stalls(scripts: Scripts) -> None:
    """Owner SIGKILLed while wandb-core is stalled: nobody is left to kill the logger, so it
    ends itself once its budget is spent (close_timeout plus a grace); nothing outlives it."""
    proc = scripts.start_file(LIFECYCLE, ["logger-watchdog"])
    t0 = time.monotonic()
    info = wait_for_report(proc, "logger_pid")
    cores = [psutil.Process(pid) for pid in info["core"]]
    try:
        for core in cores:
            core.suspend()
        proc.kill()
        proc.wait(10)  # not communicate(): the stopped wandb-core holds the output pipes
        killed_at = time.monotonic()
        logger = info["logger_pid"]
        while psutil.pid_exists(logger) and time.monotonic() - killed_at < 20:
            if psutil.Process(logger).status() == psutil.STATUS_ZOMBIE:
                break
            time.sleep(0.1)
        gone_after = time.monotonic() - killed_at
    finally:
        for core in cores:
            try:
                core.resume()
            except psutil.Error:
                pass
    res = scripts.finish(proc, 30, t0)
    assert gone_after < 3 + 1 + 2  # budget + watchdog grace + detection slack
    assert "could not finish the run within its" in res.stderr
    assert res.leftovers == []


def test_init_does_not_wait_on_a_dead_logger(scripts: Scripts) -> None:
    """With the logger dead, a worker's init() returns at once (it knows the pid is gone)
    instead of waiting for a welcome that cannot come; logging goes on."""
    res = scripts.run_file(LIFECYCLE, ["init-does-not-wait-on-a-dead-logger"])
    assert res.returncode == 0, res.stderr
    assert reports(res.stdout)["init_s"] < 3


def test_remote_rank_heartbeats_and_death(scripts: Scripts) -> None:
    """A rank on another host (its pid means nothing to the logger) is kept alive by
    heartbeats while it is quiet, and declared gone a few seconds after it dies, so close()
    does not wait for it until the straggler deadline."""
    res = scripts.run_file(LIFECYCLE, ["remote-rank-heartbeats-and-death"], timeout=120)
    assert res.returncode == 0, res.stderr
    info = reports(res.stdout)
    assert info["stats"]["_funnel/dead_ranks"] == 1  # the quiet one was not taken for dead
    assert info["close_s"] < 20  # well before the 24 s straggler deadline
    run = only_run(scripts.wandb_dir)
    assert run.column("c") == [(0, 0), (1, 1)]  # step 0 merged; the quiet rank's step 1 too
    assert res.leftovers == []


@pytest.mark.sink("wandb")
def test_close_with_a_row_backlog_keeps_its_deadline_and_accounting(scripts: Scripts) -> None:
    """More rows than wandb can write within close_timeout: close() still ends in time, and
    the run still gets its summary and exit record, with the rows that did not fit counted
    as dropped (records + dropped == sent)."""
    res = scripts.run_file(LIFECYCLE, ["close-with-a-row-backlog"], timeout=120)
    assert res.returncode == 0, res.stderr
    info = reports(res.stdout)
    assert info["close_s"] <= 6 + 1.5  # close_timeout, plus slack for a loaded CI machine
    stats = info["stats"]
    assert stats["_funnel/records"] + stats["_funnel/dropped_records"] == 40000
    run = only_run(scripts.wandb_dir)
    assert run.exit_code == 0
    assert run.summary["_funnel/records"] == stats["_funnel/records"] == len(run.history)
