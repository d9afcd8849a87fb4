"""An iteration judged once its job has ended: the owner's exit code against the scenario's,
the socket files left behind, and what the ``.wandb`` files say against what the program sent
(the balance sent = logged + dropped + lost, and the runs' exit records)."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess

from wandb_funnel.soak import probe
from wandb_funnel.soak.iteration import Iteration
from wandb_funnel.soak.runfile import find_runs
from wandb_funnel.soak.scenarios import Scenario


def _read_tail(path: pathlib.Path, limit: int = 65536) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def expect_fault_effects(scenario: Scenario, it: Iteration) -> bool:
    """False when the program ended before its fault was due, or when the fault landed
    after the program's last line (``program_end``: the interpreter's own exit, not the
    product's): the exit codes the fault would cause cannot be checked then. Such iterations
    are counted apart ("faults missed"), so a soak that never hits its faults cannot pass
    for a green one."""
    return scenario.fault is None or (it.fault_done and not it.fault_after_end)


def check_sockets(it: Iteration, tmp: str) -> None:
    """Ours (the logger's private ``wandb-funnel-*`` directory) must be gone. wandb-core's
    own sockets (``wandb_symon-*.sock``) are listed apart: a SIGTERMed or SIGKILLed
    wandb-core leaves them, and nothing of ours can remove them."""
    for root, dirs, files in os.walk(tmp):
        for name in dirs + files:
            path = os.path.relpath(os.path.join(root, name), tmp)
            if path.startswith("wandb-funnel-"):
                it.leftover_sockets.append(path)
            elif name.endswith(".sock"):
                it.wandb_sockets.append(path)
    shutil.rmtree(tmp, ignore_errors=True)
    if it.leftover_sockets and not it.plain:
        it.problems.append(f"socket files left: {it.leftover_sockets}")


def account(
    scenario: Scenario, it: Iteration, directory: pathlib.Path, sent: str, plain: bool
) -> None:
    """What the ``.wandb`` files say, and, when the program counted what it sent through the
    probe, the balance sent = logged + dropped (+ lost with a reason). A program that never
    used the probe (a user's) is not balanced: nothing says what it sent."""
    returned, attempted = probe.read_sent_file(sent)
    it.probe_used = it.probe_used or any(attempted)
    it.sent = sum(returned)
    in_flight = sum(attempted) - it.sent  # calls a signal interrupted before they counted
    try:
        runs = find_runs(directory)
    except (subprocess.SubprocessError, OSError, ValueError) as exc:
        it.problems.append(f"cannot read the .wandb file: {exc}")
        return
    it.run_exits = [r.exit_code for r in runs]
    it.runs = [
        {
            "file": str(r.path.relative_to(directory)),
            "exit_code": r.exit_code,
            "history_rows": len(r.history),
            "records": r.summary.get("_funnel/records"),
            "dropped_records": r.summary.get("_funnel/dropped_records"),
        }
        for r in runs
    ]
    it.dropped = sum(int(r.summary.get("_funnel/dropped_records", 0)) for r in runs)
    if it.probe_used:
        it.logged = sum(r.count_cells(r"r\d+") for r in runs)
        it.lost = it.sent - it.logged - it.dropped
    if plain:
        return
    if it.lost < 0 and -it.lost > in_flight:
        it.problems.append(f"{-it.lost} more records in the run than were sent")
    elif it.lost > 0:
        if scenario.may_lose:
            it.lost_reason = scenario.may_lose
        elif scenario.may_lose_if_killed and it.grace_killed:
            it.lost_reason = scenario.may_lose_if_killed
        else:
            unaccounted = sum("_funnel/records" not in r.summary for r in runs)
            hint = (
                f" ({unaccounted} run(s) without the funnel's accounting in the summary: the "
                f"logger did not finish them)"
                if unaccounted
                else ""
            )
            it.problems.append(f"{it.lost} records lost without a reason{hint}")
    if scenario.run_exit is not None and not it.hang and expect_fault_effects(scenario, it):
        if len(runs) != scenario.runs:
            it.problems.append(f"{len(runs)} runs written, expected {scenario.runs}")
        accepted = {scenario.run_exit}
        if scenario.run_exit_if_closing is not None and it.closing_before_fault:
            accepted.add(scenario.run_exit_if_closing)
        wrong = [c for c in it.run_exits if c not in accepted]
        if wrong:
            it.problems.append(f"run exit records {it.run_exits}, expected {scenario.run_exit}")


def check_owner_exit(scenario: Scenario, it: Iteration, signalled: list[str]) -> None:
    """The owner's exit code against the scenario's (``signalled``: the processes a job-wide
    fault reached, named in the problem). Not checked when the fault could not have its
    effect (``expect_fault_effects``), unless it landed after the program's last line."""
    if it.owner_exit is None or scenario.owner_exit is None:
        return
    if expect_fault_effects(scenario, it):
        expected = scenario.owner_exit
    elif it.fault_after_end:
        # After the program's last line a signal meets CPython's own exit: its handler
        # ran first (the scenario's code), or ran inside atexit, which swallows its
        # SystemExit (0), or came after the handlers were gone (killed by the signal).
        expected = (*scenario.owner_exit, 0, -signal.SIGTERM)
    else:
        expected = ()
    if expected and it.owner_exit not in expected:
        known = scenario.known_abort
        if known and known in _read_tail(pathlib.Path(it.directory) / "stderr.txt"):
            it.known_abort = True  # torch's, not ours: counted apart (Scenario.known_abort)
        else:
            reached = f" (the fault reached {signalled})" if signalled else ""
            it.problems.append(f"owner exit code {it.owner_exit}, expected {expected}{reached}")
