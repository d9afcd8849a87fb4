"""What the test programs share: the REPORT lines the tests read, and sub-commands.

The programs in this directory are scripts, run as the owner process of a scenario by a test
(``Scripts.run_file(program("lifecycle"), ["exception-in-block"])`` in tests/conftest.py):

    python tests/programs/lifecycle.py SCENARIO [--option VALUE ...]

A script's own directory comes first on ``sys.path``, in the program, in its multiprocessing
children (spawn and forkserver children get the parent's ``sys.path``) and in each worker
torchrun starts, so ``from _prelude import ...`` works in all of them. Children import the
program's module by path (as ``__mp_main__``): whatever a child runs is a function at the top
level of the module, and a program starts nothing outside ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import argparse
import atexit
import json
import sys
from collections.abc import Callable
from typing import Any

Scenario = Callable[[argparse.Namespace], None]
Option = Callable[[argparse.ArgumentParser], object]


def report(**kw: Any) -> None:
    """Print ``REPORT {json}``, which the test merges with ``reports`` / ``wait_for_report``."""
    # One write per line: ranks share torchrun's stdout, and print() writes the text and
    # its newline separately when unbuffered, so two ranks' lines could run together.
    sys.stdout.write("REPORT " + json.dumps(kw) + "\n")
    sys.stdout.flush()


def option(*flags: str, **kwargs: Any) -> Option:
    """An option of one scenario, as ``ArgumentParser.add_argument`` takes it."""

    def add(parser: argparse.ArgumentParser) -> object:
        return parser.add_argument(*flags, **kwargs)

    return add


class Scenarios:
    """A program's scenarios, one sub-command each (named after the function, ``_`` -> ``-``).

    scenario = Scenarios(__doc__)

    @scenario(option("--method", choices=["spawn", "fork"], required=True))
    def child_logs(args: argparse.Namespace) -> None: ...

    if __name__ == "__main__":
        scenario.main()
    """

    def __init__(self, description: str | None) -> None:
        self.parser = argparse.ArgumentParser(
            description=description, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        self._commands = self.parser.add_subparsers(
            dest="scenario", required=True, metavar="SCENARIO"
        )

    def __call__(self, *options: Option) -> Callable[[Scenario], Scenario]:
        def register(fn: Scenario) -> Scenario:
            doc = (fn.__doc__ or "").strip().split("\n\n")[0].replace("%", "%%")
            command = self._commands.add_parser(fn.__name__.replace("_", "-"), help=doc)
            for add in options:
                add(command)
            command.set_defaults(run_scenario=fn)
            return fn

        return register

    def main(self, argv: list[str] | None = None) -> None:
        args = self.parser.parse_args(argv)
        args.run_scenario(args)


def end_process_group_at_exit() -> None:
    """End torch's process group in an exit hook, in a framework's program that leaves it to
    CPython's finalization (accelerate, HF and Lightning do): torch's gloo group torn down
    there aborts a rank now and then ("terminate called without an active exception":
    pytorch#157193, docs/guide/known-limits.md), plain wandb's job as the funnel's (CI saw it
    in a plain Lightning rank and in an accelerate rank). Registered at import, so it runs
    after wandb's and the funnel's exit hooks (atexit runs the last registered first)."""

    def end() -> None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()

    atexit.register(end)
