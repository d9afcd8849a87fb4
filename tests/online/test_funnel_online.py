"""The funnel online, against a real W&B-compatible server (OpenWandb) behind our fault
proxy: what arrives on the server, and what a server that does not answer costs (never a
rank's time, never a row, never the exit)."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from tests.conftest import ScriptResult, Scripts, program, reports
from tests.online.conftest import Online
from tests.wandb_reader import WandbRun, read_run, step_of

pytestmark = [pytest.mark.online, pytest.mark.processes]

ONLINE = program("online")
STEPS = 20
WORKERS = 2
RANKS = ["ranks", "--workers", str(WORKERS), "--steps", str(STEPS)]


def _rows_of_every_rank(history: list[dict[str, Any]]) -> None:
    """Each step's row holds every rank's key once, and the mean of their losses."""
    assert [int(step_of(row)) for row in history] == list(range(STEPS))
    for row in history:
        step = int(step_of(row))
        assert {row[f"w{r}"] for r in range(WORKERS + 1)} == {step}
        assert row["loss"] == pytest.approx(1.0 / (step + 1))


def _local_run(seen: dict[str, Any]) -> WandbRun:
    run_dir = pathlib.Path(seen["dir"]).parent
    (log,) = run_dir.glob("run-*.wandb")
    return read_run(log)


def _sync_commands(stderr: str) -> list[str]:
    """The upload commands the funnel printed, in order: its advice is one line that starts
    with ``wandb sync``, the segments' commands joined by ``; `` so that it pastes whole."""
    lines: list[str] = re.findall(r"^\s*(wandb sync .+)$", stderr, re.MULTILINE)
    return [command.strip() for line in lines for command in line.split("; ")]


def _sync_command(stderr: str) -> list[str]:
    """The last upload command the funnel printed, as argv."""
    commands = _sync_commands(stderr)
    assert commands, stderr[-3000:]
    return commands[-1].split()


def _run_sync(command: list[str], online: Online, scripts: Scripts) -> None:
    """The printed command, as the user runs it once the server answers (wandb's own CLI)."""
    wandb_cli = pathlib.Path(sys.executable).with_name("wandb")
    env = {**scripts.env(online.env)}
    done = subprocess.run(
        [str(wandb_cli), *command[1:]],
        cwd=scripts.tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def _ranks(
    scripts: Scripts, online: Online, *args: str, env: dict[str, str] | None = None
) -> tuple[ScriptResult, dict[str, Any]]:
    result = scripts.run_file(
        ONLINE,
        [*RANKS, *args],
        timeout=200,
        extra_env={**online.env, **(env or {})},
    )
    assert not result.leftovers, result.leftovers
    return result, reports(result.stdout)


@pytest.mark.timeout(200)
def test_an_online_run_reaches_the_server_whole(online: Online, scripts: Scripts) -> None:
    """Three ranks, 20 steps, online and healthy: the server has every row once, merged, the
    config, the summary with the funnel's accounting; the run is finished."""
    result, seen = _ranks(scripts, online)
    assert result.returncode == 0, result.stderr[-4000:]
    assert seen["exit_codes"] == [0] * WORKERS and seen["offline"] is False, seen
    assert seen["url"].startswith(online.proxy.url) and seen["run_id"] in seen["url"]
    stats = seen["stats"]
    assert stats["_funnel/records"] == STEPS * (WORKERS + 1) and stats["_funnel/rows"] == STEPS
    assert stats["_funnel/dropped_records"] == 0 and stats["_funnel/late_records"] == 0
    server = online.run(seen["run_id"])
    _rows_of_every_rank(server.history)
    assert server.config["lr"] == 0.1 and server.config["workers"] == WORKERS
    assert server.summary["best"] == 1.0
    # The accounting is in the run's uploaded wandb-summary.json; the server's summary table
    # (from the filestream) holds no key that starts with "_" (no _runtime or _step either).
    assert "_funnel/records" not in server.summary
    assert server.summary_file is not None
    assert server.summary_file["_funnel/records"] == STEPS * (WORKERS + 1)
    assert server.state == "finished" and server.exit_code == 0
    assert online.proxy.history_lines()[seen["run_id"]] == STEPS  # each row sent once
    assert "did not answer" not in result.stderr


@pytest.mark.timeout(200)
def test_a_server_that_never_answers_costs_no_rank_any_time_and_no_row(
    online: Online, scripts: Scripts
) -> None:
    """Nothing answers at WANDB_BASE_URL (connection refused) and start_timeout is a minute:
    the ranks log at once, the job ends in seconds (its close stops the wait), the run is
    recorded offline under its id with every row, and the one message names the URL, the
    error and the command; that command, once the server answers, uploads every row."""
    refused = "http://127.0.0.1:9"  # the discard port: nothing listens on it here
    # A short close budget: the close waits for the server only within it.
    args = ["--start-timeout", "60", "--close-timeout", "10"]
    result, seen = _ranks(scripts, online, *args, env={"WANDB_BASE_URL": refused})
    assert result.returncode == 0, result.stderr[-4000:]
    # The start did not wait for the network: the job ended well within start_timeout.
    assert result.elapsed < 60, result.elapsed
    assert seen["exit_codes"] == [0] * WORKERS and seen["offline"] is True
    said = [line for line in result.stderr.splitlines() if "did not answer" in line]
    assert len(said) == 1, result.stderr[-4000:]
    assert refused in said[0] and "connection refused" in said[0]
    assert seen["run_id"] in said[0] and "offline" in said[0]
    assert pathlib.Path(seen["dir"]).parent.name.startswith("offline-run-")
    local = _local_run(seen)
    assert local.run_id == seen["run_id"]
    _rows_of_every_rank(local.history)
    assert local.exit_code == 0 and local.summary["_funnel/dropped_records"] == 0
    assert seen["stats"]["_funnel/records"] == STEPS * (WORKERS + 1)

    command = _sync_command(result.stderr)
    assert command == ["wandb", "sync", str(pathlib.Path(seen["dir"]).parent)]
    _run_sync(command, online, scripts)
    server = online.run(seen["run_id"])
    _rows_of_every_rank(server.history)
    assert server.summary["best"] == 1.0 and server.config["lr"] == 0.1


@pytest.mark.timeout(200)
def test_a_server_that_answers_too_late_gets_an_offline_run_while_training_goes_on(
    online: Online, scripts: Scripts
) -> None:
    """The server black-holes every request: past start_timeout (3 s) the run opens offline
    while the ranks are still logging (0.3 s a step), and nothing they logged is lost."""
    online.proxy.black_hole()
    result, seen = _ranks(scripts, online, "--start-timeout", "3", "--step-pause", "0.3")
    assert result.returncode == 0, result.stderr[-4000:]
    said = [line for line in result.stderr.splitlines() if "did not answer" in line]
    assert len(said) == 1 and "timed out" in said[0], result.stderr[-4000:]
    assert "closed before it answered" not in said[0]  # it gave up at start_timeout
    local = _local_run(seen)
    _rows_of_every_rank(local.history)
    assert local.summary["_funnel/dropped_records"] == 0
    assert online.run_ids() == []  # nothing reached the server


@pytest.mark.timeout(200)
def test_raise_is_plain_wandbs_behaviour_with_the_cause_named(
    online: Online, scripts: Scripts
) -> None:
    refused = "http://127.0.0.1:9"
    result, _ = _ranks(
        scripts,
        online,
        "--start-timeout",
        "3",
        "--on-network-error",
        "raise",
        env={"WANDB_BASE_URL": refused},
    )
    assert result.returncode == 1
    assert "LoggerStartError" in result.stderr and refused in result.stderr
    assert "connection refused" in result.stderr


@pytest.mark.timeout(200)
def test_a_stalled_upload_at_the_end_is_bounded_truthful_and_uploads_later(
    online: Online, scripts: Scripts
) -> None:
    """The filestream never answers: wandb's finish would wait for ever. The close ends by
    close_timeout, says that every row and the exit record are safe on disk (never that they
    are lost), gives the exact command, and the owner still gets the whole accounting.
    Once the server answers, that command uploads every row, once."""
    hold = scripts.tmp_path / "hold"
    proc = scripts.start_file(
        ONLINE,
        [*RANKS, "--close-timeout", "8", "--hold", str(hold)],
        extra_env=online.env,
    )
    t0 = time.monotonic()
    while not pathlib.Path(f"{hold}.ready").exists():  # the run is open, every step logged
        assert proc.poll() is None and time.monotonic() - t0 < 120
        time.sleep(0.05)
    online.proxy.black_hole(only="filestream")
    hold.touch()
    result = scripts.finish(proc, 120, t0)
    seen = reports(result.stdout)
    assert result.returncode == 0, result.stderr[-4000:]
    assert not result.leftovers
    assert result.elapsed < 100
    assert "are lost" not in result.stderr, result.stderr[-4000:]
    assert "Safe on this disk" in result.stderr and "exit record" in result.stderr
    stats = seen["stats"]
    assert stats is not None and stats["_funnel/records"] == STEPS * (WORKERS + 1)
    assert stats["_funnel/dropped_records"] == 0
    assert stats["_funnel/exit_reason"].endswith("out of time inside wandb")
    local = _local_run(seen)
    _rows_of_every_rank(local.history)
    assert local.exit_code == 0 and local.summary["_funnel/rows"] == STEPS

    command = _sync_command(result.stderr)
    assert command[:3] == ["wandb", "sync", "--include-online"]
    online.proxy.healthy()
    _run_sync(command, online, scripts)
    server = online.run(seen["run_id"])
    _rows_of_every_rank(server.history)


FAULTS = {
    "delay": lambda proxy: proxy.delay(3.0, only="filestream", times=3),
    "reset": lambda proxy: proxy.reset(only="filestream", times=3),
    "http-429": lambda proxy: proxy.status(429, {"Retry-After": "1"}, only="filestream", times=3),
    "http-500": lambda proxy: proxy.status(500, only="filestream", times=3),
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_filestream_that_stalls_refuses_or_rate_limits_mid_run_loses_no_row(
    online: Online, scripts: Scripts, fault: str
) -> None:
    """Mid-run (the ranks log a step every 0.2 s), the filestream is delayed, reset, rate
    limited (429 with Retry-After) or failing (500) a few times: every row arrives once."""
    FAULTS[fault](online.proxy)
    result, seen = _ranks(scripts, online, "--step-pause", "0.2", "--close-timeout", "60")
    assert result.returncode == 0, result.stderr[-4000:]
    assert online.proxy.requests("filestream", faulted=True) >= 1  # the fault did happen
    assert seen["stats"]["_funnel/dropped_records"] == 0
    server = online.run(seen["run_id"])
    _rows_of_every_rank(server.history)
    assert server.state == "finished"


@pytest.mark.timeout(240)
def test_a_server_killed_mid_run_and_back_loses_no_row(online: Online, scripts: Scripts) -> None:
    restart = threading.Timer(1.5, online.server.restart, kwargs={"down_for": 4.0})
    restart.start()
    try:
        result, seen = _ranks(scripts, online, "--step-pause", "0.4", "--close-timeout", "60")
    finally:
        restart.join(120)
    assert result.returncode == 0, result.stderr[-4000:]
    server = online.run(seen["run_id"])
    _rows_of_every_rank(server.history)


def test_a_run_a_restarted_logger_continued_uploads_every_step_once(
    online: Online, scripts: Scripts
) -> None:
    """Offline, the logger SIGKILLed mid-run (issue 26): the run is in two segments; the
    commands the logger printed (one ``wandb sync`` per segment, in order) put every step of
    every worker on the server exactly once, with wandb's ``_step`` running on."""
    from collections import Counter

    result = scripts.run_file(program("restart"), ["kill-mid-run", "--kill", "logger"], 120)
    assert result.returncode == 0, result.stderr[-4000:]
    run_id = reports(result.stdout)["run_id"]
    commands = _sync_commands(result.stderr)
    assert len(commands) == 2, result.stderr[-3000:]
    for command in commands:
        _run_sync(command.split(), online, scripts)
    server = online.server.run("restart", run_id, proxy=online.proxy)
    for worker in ("w1", "w2"):
        seen = Counter(step_of(row) for row in server.history if worker in row)
        assert sorted(seen) == list(range(600)) and set(seen.values()) == {1}, worker
    assert sorted(step_of(row) for row in server.history) == list(range(600))


@pytest.mark.parametrize("kill", ["logger", "core"])
def test_online_a_restarted_logger_continues_the_run_on_the_server(
    online: Online, scripts: Scripts, kill: str
) -> None:
    """Online, the logger (or its wandb-core) SIGKILLed mid-run: the new logger resumes the
    run on the server; what the dead one had not uploaded is in its segment's local file,
    and the command the logger prints uploads it: then every step of every worker is on the
    server."""
    from collections import Counter

    # 40 ms a step: the kill (past step 150) lands once the run is open online
    args = ["kill-mid-run", "--kill", kill, "--delay", "0.04"]
    result = scripts.run_file(program("restart"), args, 150, extra_env=online.env)
    assert result.returncode == 0, result.stderr[-4000:]
    run_id = reports(result.stdout)["run_id"]
    commands = _sync_commands(result.stderr)
    # one per dead logger's segment (the last uploaded itself)
    assert len(commands) == 1 and "--no-skip-online" in commands[0], result.stderr[-3000:]
    _run_sync(commands[0].split(), online, scripts)
    server = online.server.run("restart", run_id, proxy=online.proxy)
    for worker in ("w1", "w2"):
        seen = Counter(step_of(row) for row in server.history if worker in row)
        assert sorted(seen) == list(range(600)), (worker, sorted(set(range(600)) - set(seen)))
        assert set(seen.values()) == {1}, worker
