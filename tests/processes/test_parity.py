"""A one-process script's run through the funnel is the run plain wandb makes, where a user
looks (issue 23, item 4): ``tests/programs/parity.py`` runs with plain wandb, under
``wandb-funnel run --`` and with ``install()``, and what both runs wrote is compared: the
Logs tab (``output_raw`` records and ``output.log``), the System tab (``stats``), the
terminal (wandb's notices and its end-of-run footer), the telemetry and the run's start and
exit records. Several ranks (labelled lines and series) are tests/processes/test_console.py's.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import PROGRAMS, Scripts, leftover_processes, reports
from tests.wandb_reader import WandbRun, only_run

pytestmark = [pytest.mark.processes, pytest.mark.timeout(240)]

PROGRAM = str(PROGRAMS / "parity.py")
VARIANTS: dict[str, list[str]] = {
    "plain": [sys.executable, PROGRAM],
    "run": [sys.executable, "-m", "wandb_funnel", "run", "--", sys.executable, PROGRAM],
    "install": [sys.executable, PROGRAM, "--install"],
}


class Result:
    def __init__(self, proc: subprocess.CompletedProcess[str], run: WandbRun) -> None:
        self.proc, self.run = proc, run
        self.terminal = proc.stdout + proc.stderr
        self.times = reports(proc.stdout)


def _run(scripts: Scripts, variant: str, *args: str) -> Result:
    # wandb speaks as it does for a user (the tests' environment silences it elsewhere).
    env = {"WANDB_SILENT": "false", "WANDB_X_STATS_SAMPLING_INTERVAL": "0.5"}
    proc = scripts.run_command([*VARIANTS[variant], *args], env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert leftover_processes(scripts.mark) == []
    return Result(proc, only_run(scripts.wandb_dir))


_plain: list[Result] = []


def _plain_run(tmp_path_factory: pytest.TempPathFactory) -> Result:
    if not _plain:
        _plain.append(_run(Scripts(tmp_path_factory.mktemp("plain")), "plain"))
    return _plain[0]


def _console(run: WandbRun) -> list[tuple[str, str]]:
    """The run's console as (stream, text) in record order, consecutive records of one stream
    joined (how a process's writes were cut into records is not what a user sees); the
    REPORT line (times, different in each run) left out."""
    out: list[tuple[str, str]] = []
    for record in run.output_raw:
        text = re.sub(r"REPORT \{[^\n]*\}\n", "", record.get("line", ""))
        if not text:
            continue
        if out and out[-1][0] == record["output_type"]:
            out[-1] = (out[-1][0], out[-1][1] + text)
        else:
            out.append((record["output_type"], text))
    return out


def _output_log(run: WandbRun) -> str:
    text = (run.path.parent / "files" / "output.log").read_text()
    return re.sub(r"REPORT \{[^\n]*\}\n", "", text)


def _footer(terminal: str) -> list[str]:
    """wandb's end-of-run panel: "Run history:" and "Run summary:", as printed."""
    lines = terminal.splitlines()
    start = next(i for i, line in enumerate(lines) if line.endswith("Run history:"))
    end = next(i for i, line in enumerate(lines) if "You can sync this run" in line)
    return lines[start:end]


def _rss(run: WandbRun) -> list[float]:
    return [item["proc.memory.rssMB"] for item in run.stats if "proc.memory.rssMB" in item]


def _starts_early(result: Result) -> bool:
    """The run's start is stamped early in the user's wandb.init call (wandb stamps it as
    init begins), not near its end."""
    called, returned = result.times["init_called"], result.times["init_returned"]
    start = result.run.start_time
    assert start is not None
    return bool(called <= start + 0.01 and start - called < (returned - called) / 2)


@pytest.mark.parametrize("variant", ["run", "install"])
def test_a_one_process_script_s_run_is_plain_wandb_s_where_a_user_looks(
    variant: str, scripts: Scripts, tmp_path_factory: pytest.TempPathFactory
) -> None:
    plain = _plain_run(tmp_path_factory)
    funnel = _run(scripts, variant)
    assert funnel.run.summary["_funnel/records"] > 0, "the run did not go through the funnel"
    assert funnel.run.summary["_funnel/dropped_console_lines"] == 0

    # a, b. The Logs tab: the same text, unlabelled, stdout and stderr in the order the
    # process wrote them (the {'loss': ...} lines between the progress bar's redraws).
    assert _console(funnel.run) == _console(plain.run)
    assert "[rank " not in "".join(text for _, text in _console(funnel.run))
    assert _output_log(funnel.run) == _output_log(plain.run)
    assert "{'loss': 0.5, 'epoch': 1}" in _output_log(plain.run)  # the program wrote it

    # c. The System tab: the unlabelled proc.* series are the script's process (it holds
    # 300 MB; the logger holds about 70), and no labelled copy of it repeats them.
    assert max(_rss(plain.run)) > 300 and max(_rss(funnel.run)) > 300, (
        _rss(plain.run),
        _rss(funnel.run),
    )
    assert not [k for item in funnel.run.stats for k in item if "/l:" in k]

    # d. The terminal: wandb's banners once, and no notice about a shared wandb-core.
    for banner in ("Tracking run with wandb version", "You can sync this run to the cloud"):
        assert funnel.terminal.count(banner) == plain.terminal.count(banner) == 1, banner
    assert "Using an existing wandb-core service" not in plain.terminal
    assert "Using an existing wandb-core service" not in funnel.terminal
    assert "wandb-funnel" not in funnel.terminal  # nothing went missing: nothing to say

    # e. The footer shows the user's keys and values, as plain wandb's does; the funnel's
    # accounting stays in the run's summary.
    assert _footer(funnel.terminal) == _footer(plain.terminal)
    assert any(line.endswith("+4 ...") for line in _footer(plain.terminal))  # it was cut
    assert funnel.run.summary["_funnel/dropped_records"] == 0

    # f. Telemetry lists the script's imports, as wandb.init records its caller's.
    assert "torch" in plain.run.telemetry.get("imports_init", {})
    assert funnel.run.telemetry.get("imports_init") == plain.run.telemetry.get("imports_init")

    # g. The run's start time is stamped early in the user's wandb.init, as plain wandb's
    # (it was the logger's, a second or more later). The runtime is wandb-core's own clock,
    # from the logger's init: present here (the script runs 2.5 s), shorter than plain's by
    # the logger's start (docs/guide/known-limits.md).
    assert _starts_early(plain) and _starts_early(funnel), (
        plain.times,
        funnel.times,
        plain.run.start_time,
        funnel.run.start_time,
    )
    assert plain.run.runtime is not None and funnel.run.runtime is not None


def test_a_drop_is_said_on_the_terminal_with_the_footer_left_to_the_user(
    scripts: Scripts,
) -> None:
    """A console flood past the bound: lines are dropped and counted; the footer still
    shows only the user's keys, and the logger says what was dropped, with the count the
    run's summary holds."""
    funnel = _run(scripts, "run", "--flood", "30000")
    dropped = funnel.run.summary["_funnel/dropped_console_lines"]
    assert dropped > 0
    assert f"{dropped} dropped_console_lines" in funnel.proc.stderr, funnel.proc.stderr[-2000:]
    assert not [line for line in _footer(funnel.terminal) if "funnel/" in line]


def test_the_footer_shows_a_users_own_global_step_as_plain_wandb_does(
    scripts: Scripts, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The footer leaves out the funnel's x-axis key, but not the user's own key of that
    name (``tests/programs/user_global_step.py`` logs ``global_step``: 1000, 2000, ...)."""
    command = [sys.executable, str(PROGRAMS / "user_global_step.py")]
    env = {"WANDB_SILENT": "false"}
    plain_scripts = Scripts(tmp_path_factory.mktemp("plain-step"))
    plain = plain_scripts.run_command(command, env)
    funnel = scripts.run_command(VARIANTS["run"][:-2] + command, env)
    assert plain.returncode == 0 and funnel.returncode == 0, funnel.stderr[-3000:]
    assert only_run(scripts.wandb_dir).summary["_funnel/records"] == 6
    assert leftover_processes(scripts.mark) == []

    def steps(terminal: str) -> list[str]:
        return [line for line in _footer(terminal) if " global_step " in line]

    assert steps(funnel.stdout + funnel.stderr) == steps(plain.stdout + plain.stderr)
    assert any(line.endswith("global_step 6000") for line in steps(plain.stdout + plain.stderr))


def _wandb_lines(terminal: str) -> list[str]:
    """The lines wandb printed, paths, run ids and colours out (each run has its own; wandb's
    exit hook colours its lines where the logger's finish does not)."""
    terminal = re.sub(r"\x1b\[[0-9;]*m", "", terminal)
    lines = [line for line in terminal.splitlines() if line.startswith("wandb:")]
    return [re.sub(r"(\./)?wandb/offline-run-\S+|/\S+", "<path>", line) for line in lines]


def test_a_script_that_never_finishes_prints_what_plain_wandb_prints(
    scripts: Scripts, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """No "Run history:" / "Run summary:" block where plain wandb's exit hook prints none,
    and nothing of the funnel's own on a normal run (issue 34, item 6)."""
    from tests.conftest import a_lack, side_by_side

    command = [sys.executable, str(PROGRAMS / "no_finish.py")]
    env = {"WANDB_SILENT": "false"}
    plain_scripts = Scripts(tmp_path_factory.mktemp("plain-no-finish"))
    plain, funnel = side_by_side(
        lambda: plain_scripts.run_command(command, env),
        lambda: scripts.run_command([*VARIANTS["run"][:-2], *command], env),
    )
    assert plain.returncode == 0 and funnel.returncode == 0, funnel.stderr[-3000:]
    assert only_run(scripts.wandb_dir).summary["_funnel/records"] == 3  # through the funnel
    plain_lines = _wandb_lines(plain.stdout + plain.stderr)
    funnel_lines = _wandb_lines(funnel.stdout + funnel.stderr)
    assert not any("Run history" in line or "Run summary" in line for line in plain_lines)
    # The same lines (wandb's exit hook prints its last ones on stdout, the logger on stderr).
    assert sorted(line for line in funnel_lines if line.strip() != "wandb:") == sorted(
        line for line in plain_lines if line.strip() != "wandb:"
    )
    others = [
        line
        for line in (funnel.stdout + funnel.stderr).splitlines()
        if line.strip() and not line.startswith("wandb:") and not a_lack(line)
    ]
    assert others == [], others
    assert leftover_processes(scripts.mark) == []
