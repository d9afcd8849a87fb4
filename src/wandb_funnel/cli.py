"""The ``wandb-funnel`` command: ``wandb-funnel run -- COMMAND`` (``_run_command``) and
``wandb-funnel soak`` (the soak harness, below)."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.util
import pathlib
import shlex
import shutil
import signal
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any

from wandb_funnel import _run_command as run_command
from wandb_funnel._version import __version__

if TYPE_CHECKING:
    from wandb_funnel.soak.harness import Iteration
    from wandb_funnel.soak.scenarios import Scenario

_USAGE = """wandb-funnel soak [options] -- COMMAND [ARG ...]
       wandb-funnel soak [options] --matrix FILE"""
_DESCRIPTION = """\
Run a program over and over with a fault injected into each run, and report, per fault: hangs
(with py-spy stacks when py-spy is installed), the owner's exit codes, the time to exit,
processes and funnel socket files left behind, and what the .wandb runs say (their exit
record, _funnel/dropped_records). Each run gets a private offline WANDB_DIR (the iteration's
directory under --out), a private TMPDIR and a marker in its environment that finds every
process of the job.

With -- COMMAND (your program, e.g. `python train.py` or `torchrun ... train.py`, run in the
current directory) exit codes are reported, not judged: your handlers decide them. A hang,
a process or a funnel socket file left behind fails an iteration, and the command exits 1
when any iteration failed. A fault lands a random --fault-after seconds after the start; a
program that reports through wandb_funnel.soak.probe gets the harness's full checks (the
fault lands after its `ready` event, and its records are balanced).

With --matrix FILE, the scenarios a Python file defines (SCENARIOS, a list of
wandb_funnel.soak.scenarios.Scenario) run with every expectation they state: this project
runs its own fault matrix with `--matrix soak/scenarios.py`."""


def _faults_epilog() -> str:
    from wandb_funnel.soak.scenarios import USER_FAULTS

    lines = ["faults (--fault NAME, repeatable; default: all of them):"]
    lines += [f"  {name:17} {summary}" for name, (_, summary) in USER_FAULTS.items()]
    lines += [
        "",
        "examples:",
        "  wandb-funnel soak --iterations 2 -- python train.py --epochs 1",
        "  wandb-funnel soak --fault ctrl-c --fault preempt --grace 30 \\",
        "      -- torchrun --standalone --nproc-per-node 2 train.py",
        "  wandb-funnel soak --matrix soak/scenarios.py --minutes 85 --jobs 3",
    ]
    return "\n".join(lines)


def _seconds_range(text: str) -> tuple[float, float]:
    """``A`` or ``A:B`` seconds, 0 <= A <= B."""
    try:
        parts = [float(p) for p in text.split(":")]
    except ValueError:
        parts = []
    if len(parts) == 1:
        parts *= 2
    if len(parts) != 2 or not 0 <= parts[0] <= parts[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: expected SECONDS or MIN:MAX, 0 <= MIN <= MAX")
    return parts[0], parts[1]


def _soak(args: argparse.Namespace, chosen: list[Scenario], full_argv: list[str]) -> int:
    from wandb_funnel.soak import report
    from wandb_funnel.soak.harness import Iteration, run_iteration

    user = bool(args.target)
    missing = [s for s in chosen if any(importlib.util.find_spec(m) is None for m in s.needs)]
    for s in missing:
        print(f"not run: {s.name} needs {', '.join(s.needs)}", file=sys.stderr)
    chosen = [s for s in chosen if s not in missing]
    out = pathlib.Path(args.out)
    runs_dir = out / "iterations"
    seed = args.seed or datetime.datetime.now().strftime("%Y%m%d%H%M%S")
    started, t0 = datetime.datetime.now(datetime.timezone.utc), time.monotonic()
    stop_at = t0 + args.minutes * 60 if args.minutes else None
    counts = dict.fromkeys((s.name for s in chosen), 0)
    plain_counts = dict.fromkeys((s.name for s in chosen if s.plain), 0)
    done: list[Iteration] = []
    aborted = 0  # iterations whose jobs a second Ctrl-C killed: not judged
    lock = threading.Lock()
    stopping, aborting = threading.Event(), threading.Event()
    abort_signal = [signal.SIGINT]  # the signal that aborted: the exit code says which

    def stop(signum: int, frame: object) -> None:
        # First Ctrl-C or SIGTERM: no new iterations; the running ones finish and the table
        # is written. A second one: the running iterations' jobs are killed (those are left
        # out of the table), then the table is written. A third Ctrl-C interrupts as usual.
        # Flags only: the main loop says what they mean (a handler that prints can land
        # inside another write to stderr; suspected, not shown, where a second Ctrl-C's
        # message never came in 2 of 3 full-tier runs: docs/DESIGN.md "Open").
        if aborting.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if stopping.is_set():
            abort_signal[0] = signal.Signals(signum)
            aborting.set()
            return
        stopping.set()

    said: set[str] = set()

    def say_what_the_signals_asked() -> None:
        if stopping.is_set() and "stopping" not in said:
            said.add("stopping")
            print(
                "stopping: finishing the running iterations, then writing the table "
                "(again to abort them)",
                file=sys.stderr,
                flush=True,
            )
        if aborting.is_set() and "aborting" not in said:
            said.add("aborting")
            print(
                "aborting: killing the running iterations, then writing the table",
                file=sys.stderr,
                flush=True,
            )

    def next_job() -> tuple[Scenario, int, bool] | None:
        with lock:
            if stopping.is_set():
                return None
            # The plain-wandb programs first: they are few, and some of them hang.
            for s in sorted((s for s in chosen if s.plain), key=lambda s: plain_counts[s.name]):
                if plain_counts[s.name] < args.plain:
                    plain_counts[s.name] += 1
                    return s, plain_counts[s.name], True
            if stop_at is not None and time.monotonic() >= stop_at:
                return None
            pending = [s for s in chosen if args.minutes or counts[s.name] < args.iterations]
            if not pending:
                return None
            s = min(pending, key=lambda s: counts[s.name])
            counts[s.name] += 1
            return s, counts[s.name], False

    def work(job: tuple[Scenario, int, bool]) -> Iteration:
        scenario, index, plain = job
        it_seed = f"{seed}-{scenario.name}-{index}"
        try:
            it = run_iteration(scenario, index, runs_dir, it_seed, plain, aborting)
        except Exception as exc:  # before its job started (its directory): fails this one only
            it = Iteration(
                scenario.name, index, it_seed, plain, problems=[f"harness error: {exc!r}"]
            )
        if it.aborted:
            print(
                f"{scenario.name} #{index}: aborted (its job killed; not in the table)", flush=True
            )
            if not args.keep:
                shutil.rmtree(it.directory, ignore_errors=True)
            return it
        status = "ok" if it.ok else "FAILED: " + "; ".join(it.problems)
        if user:
            fault = (
                ""
                if not it.fault
                else (f"fault at {it.fault_at_s}s, " if it.fault_done else "fault missed, ")
            )
            exit_s = f"exit {it.exit_s}s after it, " if it.exit_s is not None else ""
            balance = f", sent {it.sent} logged {it.logged} lost {it.lost}" if it.probe_used else ""
            print(
                f"{scenario.name} #{index}: owner exit {'hang' if it.hang else it.owner_exit}, "
                f"{fault}{exit_s}job {it.duration_s}s, run exit records {it.run_exits}, "
                f"dropped {it.dropped}{balance}; {status}",
                flush=True,
            )
        else:
            kind = " (plain wandb)" if plain else ""
            print(
                f"{scenario.name}{kind} #{index}: exit {it.owner_exit}, "
                f"{it.exit_s}s, sent {it.sent} logged {it.logged} dropped {it.dropped} "
                f"{status}",
                flush=True,
            )
        if it.ok and not args.keep:
            shutil.rmtree(it.directory, ignore_errors=True)
        return it

    handlers = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with ThreadPoolExecutor(args.jobs) as pool:
            running: set[Future[Iteration]] = set()
            try:
                while True:
                    while len(running) < args.jobs and (job := next_job()) is not None:
                        running.add(pool.submit(work, job))
                    say_what_the_signals_asked()
                    if not running:
                        break
                    # With a timeout: a signal the kernel hands to another thread does not
                    # wake a lock wait of the main thread, which alone runs the handler.
                    finished, running = wait(running, timeout=0.2, return_when=FIRST_COMPLETED)
                    done.extend(it for f in finished if not (it := f.result()).aborted)
                    aborted += sum(f.result().aborted for f in finished)
            except BaseException:
                # A third Ctrl-C, or a bug here: set before the executor's exit waits for the
                # running iterations, so they kill their jobs (checked each tick) at once.
                aborting.set()
                raise
    finally:
        for signum, handler in handlers.items():  # the caller's (a test's) handlers again
            signal.signal(signum, handler)

    rows = report.summarize(sorted(done, key=lambda i: (i.scenario, i.plain, i.index)))
    if user:  # the faults in the order they were asked for, not by name
        order = {s.name: n for n, s in enumerate(chosen)}
        rows.sort(key=lambda row: order.get(row["scenario"], len(order)))
    columns = report.user_columns(rows) if user else report.COLUMNS
    header: dict[str, Any] = {
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "duration_min": round((time.monotonic() - t0) / 60, 1),
        "stopped_early": stopping.is_set(),
        "aborted_iterations": aborted,
        "iterations": sum(1 for i in done if not i.plain),
        "plain_iterations": sum(1 for i in done if i.plain),
        "jobs": args.jobs,
        "seed": seed,
        "machine": report.machine(),
        "command": "wandb-funnel " + shlex.join(full_argv),
        "target": shlex.join(args.target) if user else None,
        "matrix": str(pathlib.Path(args.matrix).resolve()) if args.matrix else None,
    }
    report.write(out, rows, header, done, columns)
    print()
    print(report.text(rows, columns) if rows else "(no iterations)")
    failed = sum(row["failed"] for row in rows)
    killed = f", {aborted} aborted" if aborted else ""
    print(
        f"\n{header['iterations']} iterations, {failed} failed{killed}; "
        f"table in {out / 'soak.md'} and {out / 'soak.json'}"
    )
    if failed:
        return 1
    return 128 + abort_signal[0] if aborted else 0  # as a shell reports the signal's exit


def _soak_parser(sub: Any) -> argparse.ArgumentParser:
    soak: argparse.ArgumentParser = sub.add_parser(
        "soak",
        usage=_USAGE,
        description=_DESCRIPTION,
        epilog=_faults_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        help="run a program (or a fault matrix) over and over with injected faults; report "
        "hangs, exit codes and times, leftovers and what the runs recorded",
    )
    soak.add_argument(
        "--iterations", type=int, default=3, metavar="N", help="per fault or scenario (default 3)"
    )
    soak.add_argument(
        "--minutes",
        type=float,
        default=0,
        metavar="M",
        help="run round-robin for this long instead of a fixed count",
    )
    soak.add_argument(
        "--jobs", type=int, default=1, metavar="N", help="iterations run at once (default 1)"
    )
    soak.add_argument(
        "--out",
        default="soak-results",
        metavar="DIR",
        help="directory for the table and the failed iterations' files (default soak-results)",
    )
    soak.add_argument("--seed", default="", help="replay an earlier soak's randomness")
    soak.add_argument("--keep", action="store_true", help="keep passing iterations' files")
    soak.add_argument(
        "--list",
        action="store_true",
        help="list the faults (with --matrix: the scenarios) and exit",
    )
    soak.add_argument(
        "--deadline",
        type=float,
        default=None,
        metavar="SECONDS",
        help="a run still going this long after its start is a hang (default "
        "300 for a COMMAND, which must end well within it; with --matrix "
        "it replaces every scenario's own)",
    )
    user = soak.add_argument_group("a COMMAND (after --)")
    user.add_argument(
        "--fault",
        action="append",
        metavar="NAME",
        help="a fault to inject (see below); repeat to pick several (default: all)",
    )
    user.add_argument(
        "--fault-after",
        type=_seconds_range,
        default=(2.0, 10.0),
        metavar="MIN:MAX",
        help="the fault lands a random MIN..MAX seconds after the start (after "
        "the probe's `ready` event if the program sends probe events; "
        "default 2:10)",
    )
    user.add_argument(
        "--wait-ready",
        action="store_true",
        help="the program says `ready` through wandb_funnel.soak.probe: count "
        "--fault-after from there, always (kill-worker then kills only "
        "pids that said `worker`)",
    )
    user.add_argument(
        "--grace",
        type=_seconds_range,
        default=(10.0, 10.0),
        metavar="MIN[:MAX]",
        help="seconds from SIGTERM to SIGKILL (preempt, scancel), and how long "
        "stall-wandb-core stops wandb-core (default 10)",
    )
    matrix = soak.add_argument_group("a fault matrix (--matrix)")
    matrix.add_argument(
        "--matrix",
        metavar="FILE",
        help="a Python file that defines SCENARIOS (this project's: "
        "soak/scenarios.py); its program names are relative to its "
        "PROGRAMS directory, or to the file itself",
    )
    matrix.add_argument(
        "--scenario",
        action="append",
        metavar="NAME",
        help="a scenario name or glob; repeat to pick several (default: all)",
    )
    matrix.add_argument(
        "--plain",
        type=int,
        default=1,
        metavar="N",
        help="runs of each public report's plain-wandb program (default 1)",
    )
    return soak


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    full_argv = list(argv)
    target: list[str] = []
    if "--" in argv:  # everything after the first ``--`` is the user's command, untouched
        cut = argv.index("--")
        argv, target = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(prog="wandb-funnel")
    parser.add_argument("--version", action="version", version=f"wandb-funnel {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    soak = _soak_parser(sub)
    run = run_command.add_parser(sub)
    status = sub.add_parser(
        "status",
        help="the running funnels of this user on this node, and every rank's progress",
        description="The running funnels of this user on this node: run, state, rows, and "
        "each rank's last step, seconds since its last record, records, drops and steps "
        "per second (read from what each funnel's logger writes once a second).",
    )
    status.add_argument("--json", action="store_true", help="one JSON object (a contract)")
    status.add_argument("--watch", action="store_true", help="again every second")
    args = parser.parse_args(argv)
    args.target = target
    if args.command == "status":
        from wandb_funnel import _status

        return _status.main(args.json, args.watch)
    if args.command == "run":
        # `wandb-funnel run python train.py` needs no `--`: the command starts at the first
        # word that is not one of our options (as opentelemetry-instrument and ddtrace-run
        # take it); a `--` inside that command is the command's own.
        if args.command_words:
            target = [*args.command_words, *(["--", *target] if "--" in full_argv else [])]
        return run_command.main(run, args, target)
    if args.command != "soak":
        return 2
    # A shell starting us in the background (nohup cmd &) ignores SIGINT, and an ignored
    # signal is inherited through exec: the programs would then shrug off the Ctrl-C
    # scenario. A handler of ours is reset to the default at exec instead.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if args.matrix and target:
        soak.error("give either --matrix FILE or -- COMMAND, not both")
    if "--" in full_argv and not target:
        soak.error("no command after --")
    if args.iterations < 1 or args.jobs < 1 or args.minutes < 0 or args.plain < 0:
        soak.error("--iterations and --jobs must be >= 1; --minutes, --plain >= 0")
    if args.deadline is not None and args.deadline <= 0:
        soak.error("--deadline must be > 0")
    from wandb_funnel.soak import scenarios

    if args.matrix:
        if args.fault or args.wait_ready:
            soak.error(
                "--fault and --wait-ready are for a COMMAND; pick a matrix's scenarios "
                "with --scenario"
            )
        try:
            chosen = scenarios.select(scenarios.load_matrix(args.matrix), args.scenario)
        except ValueError as exc:
            soak.error(str(exc))
        if args.deadline is not None:
            chosen = [dataclasses.replace(s, deadline=args.deadline) for s in chosen]
        if args.list:
            for s in chosen:
                print(f"{s.name:24} {s.summary}")
            return 0
    else:
        if args.scenario:
            soak.error(
                "--scenario picks a matrix's scenarios (--matrix FILE); for a COMMAND use --fault"
            )
        if args.list:
            for name, (_, summary) in scenarios.USER_FAULTS.items():
                print(f"{name:17} {summary}")
            return 0
        if not target:
            soak.error(
                "nothing to run: give your program after -- (wandb-funnel soak -- "
                "python train.py) or a fault matrix (--matrix FILE)"
            )
        try:
            chosen = scenarios.user_matrix(
                target,
                args.fault,
                fault_after=args.fault_after,
                grace=args.grace,
                deadline=300.0 if args.deadline is None else args.deadline,
                wait_ready=args.wait_ready,
            )
        except ValueError as exc:
            soak.error(str(exc))
    if importlib.util.find_spec("psutil") is None:
        print("wandb-funnel soak needs psutil: pip install 'wandb-funnel[soak]'", file=sys.stderr)
        return 2
    return _soak(args, chosen, full_argv)


if __name__ == "__main__":
    sys.exit(main())
