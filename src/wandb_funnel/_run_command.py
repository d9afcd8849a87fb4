"""``wandb-funnel run [options] -- COMMAND [ARG ...]``: zero code change.

Exports the install (``_WANDB_FUNNEL_INSTALL`` and ``_bootstrap/`` on ``PYTHONPATH``), then
*replaces itself* with COMMAND (``exec``), as ``opentelemetry-instrument`` and ``ddtrace-run``
do. Every Python process COMMAND starts, at any depth (torchrun's ranks, accelerate's, their
DataLoader workers), then has wandb installed into the moment it imports wandb; the first
``wandb.init`` (the script's, or HF's, Lightning's, accelerate's) starts or joins the funnel.

Because COMMAND *is* this process after exec, there is no wrapper in the middle: Ctrl-C and
SIGTERM reach it exactly as they would without us (once: never twice, as a forwarding parent
in the same process group would deliver them), the run is finished by the funnel's owner
inside COMMAND with COMMAND's exit code, and COMMAND's exit code is the exit code.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from typing import Any

from wandb_funnel._constants import (
    ENV_RANK_PID,
    ON_NETWORK_ERROR,
    RANK_SCOPES,
    REDUCERS,
    RESTARTS,
    RUN_MODES,
    TIERS,
)
from wandb_funnel._options import FunnelOptions, parse_option, resolve

USAGE = "wandb-funnel run [options] [--] COMMAND [ARG ...]"
DESCRIPTION = """\
Run COMMAND with every wandb call in it, and in every Python process it starts, going
through one funnel: one run, every rank, in order, and an exit that never hangs. No code
change: `python train.py`, `torchrun ... train.py`, `accelerate launch train.py`, a shell
script. Options may also come from WANDB_FUNNEL_<OPTION> variables (WANDB_FUNNEL_RUN_MODE,
WANDB_FUNNEL_REDUCE=loss=mean,acc=max, ...); flags win."""
EPILOG = """\
examples:
  wandb-funnel run -- python train.py --epochs 1
  wandb-funnel run --reduce loss=mean --reduce acc=max -- torchrun --nproc-per-node 2 train.py
  wandb-funnel run --run-mode new -- accelerate launch train.py"""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    run: argparse.ArgumentParser = sub.add_parser(
        "run",
        usage=USAGE,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        help="run a command with wandb going through the funnel (no code change)",
    )
    run.add_argument(
        "--run-mode",
        choices=RUN_MODES,
        help="auto (default): one run, keys of several ranks reduced; shared: "
        "every rank's value as KEY/rankN; new: one run per rank",
    )
    run.add_argument(
        "--reduce",
        action="append",
        metavar="[KEY=]REDUCER",
        help=f"a reducer ({', '.join(REDUCERS)}) for every key, or for one key or glob; repeatable",
    )
    run.add_argument("--step-key", help="where a late row keeps its own step (global_step)")
    run.add_argument("--close-timeout", metavar="SECONDS", help="the most closing may take")
    run.add_argument("--start-timeout", metavar="SECONDS", help="the most opening may take")
    run.add_argument(
        "--reorder-window", metavar="SECONDS", help="how long a row waits for a straggling rank"
    )
    run.add_argument("--max-pending-rows", metavar="N")
    run.add_argument("--max-record-bytes", metavar="N")
    run.add_argument(
        "--rank-scope",
        choices=RANK_SCOPES,
        help="several nodes: one run for the job (global) or one per node (worker)",
    )
    run.add_argument(
        "--on-network-error",
        choices=ON_NETWORK_ERROR,
        help="W&B does not answer at start: record offline under the same id and say how "
        "to upload it (offline, the default), or fail as plain wandb does (raise)",
    )
    run.add_argument(
        "--stall-timeout",
        metavar="SECONDS",
        help="say which rank is behind after this long without progress (300; 0: off)",
    )
    run.add_argument(
        "--max-logger-restarts",
        metavar="N",
        help="restarts of a logger that dies, in 10 minutes (3; 0: never)",
    )
    run.add_argument(
        "--restarts",
        choices=RESTARTS,
        help="a job torchrun restarts or SLURM requeues: continue one run across its "
        "attempts (continue, the default), or a run per attempt as plain wandb (new)",
    )
    run.add_argument(
        "--tier",
        choices=TIERS,
        help="several nodes: a node logger per node (node), every rank to the root logger "
        "(flat), or the node tier when there is more than one node (auto, the default)",
    )
    # The command, when it is not after `--`: everything from its first word on, untouched.
    run.add_argument(
        "command_words",
        nargs=argparse.REMAINDER,
        metavar="COMMAND",
        help="the command to run, with its arguments (after -- if it starts with a dash)",
    )
    return run


def options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The flags given, as FunnelOptions keywords (text parsed as the variables are)."""
    out: dict[str, Any] = {}
    for name in FunnelOptions.NAMES:
        value = getattr(args, name, None)
        if value is None:
            continue
        if name == "reduce":
            merged: dict[str, str] = {}
            for item in value:
                parsed = parse_option("reduce", item)
                merged.update({"*": parsed} if isinstance(parsed, str) else parsed)
            out[name] = merged
        else:
            out[name] = parse_option(name, value)
    return out


def main(parser: argparse.ArgumentParser, args: argparse.Namespace, target: list[str]) -> int:
    if not target:
        parser.error(
            "no command: give it after the options (wandb-funnel run python train.py, "
            "or after --: wandb-funnel run -- python train.py)"
        )
    try:
        # Flags over WANDB_FUNNEL_* variables; the export carries both to every process.
        options = resolve(options_from_args(args))
        FunnelOptions(**options)
    except (TypeError, ValueError) as exc:
        parser.error(str(exc))
    from wandb_funnel._wandb_module.hooks import export

    program = shutil.which(target[0])
    if program is None:
        print(f"wandb-funnel run: {target[0]}: command not found", file=sys.stderr)
        return 127  # the shell's code for a command that is not there
    export(options)
    # Importing wandb_funnel here marked this process as a launcher's rank (SLURM's
    # variables, say); after exec that pid is COMMAND's (torchrun's agent), whose workers
    # would then all look like inherited children instead of ranks.
    os.environ.pop(ENV_RANK_PID, None)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(program, target)
    except OSError as exc:
        print(f"wandb-funnel run: {target[0]}: {exc.strerror}", file=sys.stderr)
        return 126  # found but not executable, as a shell says
    return 0  # not reached
