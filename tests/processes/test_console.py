"""Every rank's console in the run's Logs tab (issue 14), and the run's program: real torchrun
with 2 ranks, the ``.wandb`` file read back, compared with plain wandb in rank 0."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import PROGRAMS, Scripts, leftover_processes, reports, side_by_side
from tests.wandb_reader import WandbRun, only_run

pytestmark = [pytest.mark.processes, pytest.mark.timeout(240)]

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def _torchrun(
    scripts: Scripts, *args: str, extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    # wandb speaks as it does for a user (the tests' environment silences it elsewhere).
    return subprocess.run(
        [*TORCHRUN, str(PROGRAMS / "console.py"), *args],
        cwd=scripts.tmp_path,
        env=scripts.env({"WANDB_SILENT": "false", **(extra or {})}),
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )


def _console(run: WandbRun) -> str:
    return "".join(r.get("line", "") for r in run.output_raw)


def _run(
    scripts: Scripts, *args: str, extra: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], WandbRun]:
    proc = _torchrun(scripts, *args, extra=extra)
    run = only_run(scripts.wandb_dir)
    assert leftover_processes(scripts.mark) == []
    return proc, run


def test_every_ranks_console_reaches_the_run_labelled_and_the_program_is_the_script(
    scripts: Scripts, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Both ranks' prints, stderr lines, warnings, logging records and a \\r progress bar are
    in the run's output_raw records, each line labelled with its rank, and each rank's lines
    in the order it wrote them; the terminal still shows them unlabelled; each rank's system
    metrics are in the run, labelled with its rank; the run records the user's script and
    arguments, as plain wandb in rank 0 does, and every record type plain wandb writes."""
    plain_scripts = Scripts(tmp_path_factory.mktemp("plain"))
    (proc, run), (plain_proc, plain) = side_by_side(
        lambda: _run(scripts, "talk"), lambda: _run(plain_scripts, "talk", "--plain")
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    console = _console(run)
    for rank in (0, 1):
        for text in (
            f"stdout line of rank {rank}\n",
            f"stderr line of rank {rank}\n",
            f"UserWarning: a warning of rank {rank}",
            f"WARNING train: a logging record of rank {rank}\n",
            f"progress 2/3 of rank {rank}\n",
        ):
            assert f"[rank {rank}] {text}" in console or text in console, (text, console)
        mine = [
            line
            for line in console.replace("\r", "\n").splitlines()
            if line.startswith(f"[rank {rank}] ")
        ]
        order = [i for i, line in enumerate(mine) if "stdout line" in line or "progress 2" in line]
        assert len(order) == 2 and order == sorted(order)
    assert "[rank 0] " not in proc.stdout and "stdout line of rank 0" in proc.stdout
    _every_ranks_system_metrics_are_labelled(run)  # sampled while the ranks talked
    streams = {r["output_type"] for r in run.output_raw}
    assert streams == {"STDOUT", "STDERR"}
    assert run.summary["_funnel/console_lines"] >= 12
    assert run.summary["_funnel/dropped_console_lines"] == 0

    assert run.environment["program"] == plain.environment["program"]
    assert run.environment["program"].endswith("console.py")
    same = ("program", "code_path", "code_path_local", "executable", "python")
    assert {k: run.environment.get(k) for k in same} == {
        k: plain.environment.get(k) for k in same
    }, (run.environment, plain.environment)
    assert run.environment["args"] == ["talk"] and plain.environment["args"] == ["talk", "--plain"]
    assert run.environment["root"] == str(scripts.tmp_path)  # the user's working directory
    missing = set(plain.record_types) - set(run.record_types)
    assert not missing, (plain.record_types, run.record_types)
    # wandb's banners, once, in the user's terminal, as plain wandb prints them in rank 0.
    for banner in ("Tracking run with wandb version", "You can sync this run to the cloud"):
        assert (proc.stdout + proc.stderr).count(banner) == 1, banner
        assert (plain_proc.stdout + plain_proc.stderr).count(banner) == 1, banner


def test_a_job_where_only_rank_0_calls_wandb_gets_plain_wandb_s_logs_and_system_tab(
    scripts: Scripts, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """torchrun with 2 ranks where only rank 0 calls wandb (``--plain``), with plain wandb and
    under ``wandb-funnel run --``: one rank logs, so the run's console is rank 0's as plain
    wandb records it (unlabelled, in the order written, the same output.log), and the
    System tab's unlabelled proc.* series are rank 0's process (torch loaded: far above the
    logger's 70 MB), with no labelled copy."""
    sampled = {"WANDB_X_STATS_SAMPLING_INTERVAL": "0.5"}
    plain_proc, plain = _run(
        Scripts(tmp_path_factory.mktemp("plain")), "talk", "--plain", extra=sampled
    )
    assert plain_proc.returncode == 0, plain_proc.stderr[-3000:]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "wandb_funnel",
            "run",
            "--",
            *TORCHRUN,
            str(PROGRAMS / "console.py"),
            "talk",
            "--plain",
        ],
        cwd=scripts.tmp_path,
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
        env=scripts.env({"WANDB_SILENT": "false", "WANDB_X_STATS_SAMPLING_INTERVAL": "0.5"}),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = only_run(scripts.wandb_dir)
    assert leftover_processes(scripts.mark) == []
    assert run.summary["_funnel/records"] > 0  # it went through the funnel
    assert "[rank " not in _console(run)
    assert _console(run) == _console(plain)  # every write, in order, stdout and stderr
    assert "stdout line of rank 0" in _console(run) and "rank 1" not in _console(run)
    log, plain_log = (r.path.parent / "files" / "output.log" for r in (run, plain))
    # The same output.log (wandb 0.25's wandb-core writes none for an offline run, plain's
    # as well)
    assert log.exists() == plain_log.exists()
    if plain_log.exists():
        assert log.read_text() == plain_log.read_text()
    rss = [item["proc.memory.rssMB"] for item in run.stats if "proc.memory.rssMB" in item]
    plain_rss = [i["proc.memory.rssMB"] for i in plain.stats if "proc.memory.rssMB" in i]
    # Sampled as plain wandb samples (wandb 0.25's wandb-core took no sample in this short
    # job, plain's either): rank 0's process, torch loaded, far above the logger's 70 MB.
    assert bool(rss) == bool(plain_rss), (rss, plain_rss)
    assert not rss or max(rss) > 150, rss
    assert not [k for item in run.stats for k in item if "/l:" in k]


def test_the_traceback_of_a_rank_that_raises_is_in_the_run(scripts: Scripts) -> None:
    proc, run = _run(scripts, "raise")
    assert proc.returncode != 0
    console = _console(run)
    # torch.distributed's excepthook prefixes the traceback with "[rank1]: " itself.
    rank1 = [line for line in console.splitlines() if line.startswith("[rank 1] ")]
    assert any(line.endswith("Traceback (most recent call last):") for line in rank1), rank1
    assert any(line.endswith("RuntimeError: rank 1 gives up") for line in rank1), rank1
    assert "[rank 0] stdout line of rank 0\n" in console
    assert run.exit_code not in (None, 0)


def test_a_console_flood_is_bounded_and_every_line_counted(scripts: Scripts) -> None:
    """Rank 1 prints 30,000 lines as fast as it can: the lines the run holds and the lines
    counted as dropped add up to exactly 30,000, and some were dropped (the bound held)."""
    lines = 30_000
    proc, run = _run(scripts, "flood", "--lines", str(lines))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert reports(proc.stdout) == {"flooded_0": True, "flooded_1": True}
    console = _console(run)
    kept = console.count("[rank 1] flood ")
    dropped = run.summary["_funnel/dropped_console_lines"]
    assert 0 < dropped < lines and kept + dropped == lines, (kept, dropped)
    numbers = [
        int(line.split()[-1]) for line in console.splitlines() if line.startswith("[rank 1] flood ")
    ]
    assert numbers == sorted(numbers)  # what is kept stays in order
    assert proc.stdout.count("flood ") == lines  # the terminal got every line


def test_every_ranks_system_metrics_carry_its_label(scripts: Scripts) -> None:
    """With x_stats_sampling_interval=0.5, each rank samples its process tree: the run's stats
    records carry cpu and memory keys labelled /l:rank0-<host> and /l:rank1-<host>, as
    wandb labels a writer's (x_label), beside the logger's own (unlabelled) samples. (The
    gate checks the same in the console test's job, sampled while its ranks talk and sleep;
    this job keeps its ranks busy.)"""
    proc, run = _run(scripts, "stats")
    assert proc.returncode == 0, proc.stderr[-3000:]
    _every_ranks_system_metrics_are_labelled(run)


def _every_ranks_system_metrics_are_labelled(run: WandbRun) -> None:
    keys = {k for item in run.stats for k in item}
    for rank in (0, 1):
        mine = {k.split("/l:")[0] for k in keys if f"/l:rank{rank}-" in k}
        assert {"cpu", "proc.memory.rssMB", "proc.memory.percent", "proc.cpu.threads"} <= mine
    rss = [
        v
        for item in run.stats
        for k, v in item.items()
        if k.startswith("proc.memory.rssMB/l:rank1-")
    ]
    assert rss and all(10 < v < 10_000 for v in rss)  # a Python process with torch loaded
    # wandb-core's own, unlabelled, of the process that called wandb.init (rank 0, which
    # hosts), as plain wandb in rank 0 gives them; not the logger's (about 70 MB).
    owner = [item["proc.memory.rssMB"] for item in run.stats if "proc.memory.rssMB" in item]
    assert owner and max(owner) > 150, owner
