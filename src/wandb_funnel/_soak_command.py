"""``wandb-funnel soak [options] -- COMMAND`` / ``--matrix FILE``: the command line of the
soak harness (its options, their checks, the scenarios they choose). The soak itself, its
iterations run round-robin and the table, is ``soak.session``."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import signal
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wandb_funnel.soak.scenarios import Scenario

USAGE = """wandb-funnel soak [options] -- COMMAND [ARG ...]
       wandb-funnel soak [options] --matrix FILE"""
DESCRIPTION = """\
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


def add_parser(sub: Any) -> argparse.ArgumentParser:
    soak: argparse.ArgumentParser = sub.add_parser(
        "soak",
        usage=USAGE,
        description=DESCRIPTION,
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
    _add_command_options(soak)
    _add_matrix_options(soak)
    return soak


def _add_command_options(soak: argparse.ArgumentParser) -> None:
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


def _add_matrix_options(soak: argparse.ArgumentParser) -> None:
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


def main(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    target: list[str],
    full_argv: list[str],
) -> int:
    """``wandb-funnel soak``: ``parser`` is its own subparser (its errors), ``target`` the
    words after ``--``, ``full_argv`` the whole command line (for the report)."""
    # A shell starting us in the background (nohup cmd &) ignores SIGINT, and an ignored
    # signal is inherited through exec: the programs would then shrug off the Ctrl-C
    # scenario. A handler of ours is reset to the default at exec instead.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if args.matrix and target:
        parser.error("give either --matrix FILE or -- COMMAND, not both")
    if "--" in full_argv and not target:
        parser.error("no command after --")
    if args.iterations < 1 or args.jobs < 1 or args.minutes < 0 or args.plain < 0:
        parser.error("--iterations and --jobs must be >= 1; --minutes, --plain >= 0")
    if args.deadline is not None and args.deadline <= 0:
        parser.error("--deadline must be > 0")
    if args.matrix:
        chosen = _matrix_scenarios(parser, args)
    else:
        chosen = _command_scenarios(parser, args, target)
    if chosen is None:  # --list: listed
        return 0
    if importlib.util.find_spec("psutil") is None:
        print("wandb-funnel soak needs psutil: pip install 'wandb-funnel[soak]'", file=sys.stderr)
        return 2
    from wandb_funnel.soak import session

    return session.soak(args, chosen, full_argv)


def _matrix_scenarios(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> list[Scenario] | None:
    """The scenarios ``--matrix`` and ``--scenario`` choose; None once ``--list`` listed them."""
    from wandb_funnel.soak import scenarios

    if args.fault or args.wait_ready:
        parser.error(
            "--fault and --wait-ready are for a COMMAND; pick a matrix's scenarios with --scenario"
        )
    try:
        chosen = scenarios.select(scenarios.load_matrix(args.matrix), args.scenario)
    except ValueError as exc:
        parser.error(str(exc))
    if args.deadline is not None:
        chosen = [dataclasses.replace(s, deadline=args.deadline) for s in chosen]
    if args.list:
        for s in chosen:
            print(f"{s.name:24} {s.summary}")
        return None
    return chosen


def _command_scenarios(
    parser: argparse.ArgumentParser, args: argparse.Namespace, target: list[str]
) -> list[Scenario] | None:
    """A user's command with the faults ``--fault`` chooses; None once ``--list`` listed the
    faults."""
    from wandb_funnel.soak import scenarios

    if args.scenario:
        parser.error(
            "--scenario picks a matrix's scenarios (--matrix FILE); for a COMMAND use --fault"
        )
    if args.list:
        for name, (_, summary) in scenarios.USER_FAULTS.items():
            print(f"{name:17} {summary}")
        return None
    if not target:
        parser.error(
            "nothing to run: give your program after -- (wandb-funnel soak -- "
            "python train.py) or a fault matrix (--matrix FILE)"
        )
    try:
        return scenarios.user_matrix(
            target,
            args.fault,
            fault_after=args.fault_after,
            grace=args.grace,
            deadline=300.0 if args.deadline is None else args.deadline,
            wait_ready=args.wait_ready,
        )
    except ValueError as exc:
        parser.error(str(exc))
