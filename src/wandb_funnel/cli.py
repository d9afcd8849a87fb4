"""The ``wandb-funnel`` command: ``wandb-funnel run -- COMMAND`` (``_run_command``),
``wandb-funnel soak`` (the soak harness: ``_soak_command``, ``soak/``) and ``wandb-funnel
status`` (``_status``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from wandb_funnel import _run_command as run_command
from wandb_funnel import _soak_command as soak_command
from wandb_funnel._version import __version__


def _add_status_parser(sub: Any) -> argparse.ArgumentParser:
    status: argparse.ArgumentParser = sub.add_parser(
        "status",
        help="the running funnels of this user on this node, and every rank's progress",
        description="The running funnels of this user on this node: run, state, rows, and "
        "each rank's last step, seconds since its last record, records, drops and steps "
        "per second (read from what each funnel's logger writes once a second).",
    )
    status.add_argument("--json", action="store_true", help="one JSON object (a contract)")
    status.add_argument("--watch", action="store_true", help="again every second")
    return status


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
    soak = soak_command.add_parser(sub)
    run = run_command.add_parser(sub)
    _add_status_parser(sub)
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
    return soak_command.main(soak, args, target, full_argv)


if __name__ == "__main__":
    sys.exit(main())
