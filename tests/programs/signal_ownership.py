"""One signal-ownership case: a handler installed at a chosen moment meets a signal that lands
at a chosen moment, in the owner or in a worker; it prints what happened as REPORT lines.

Run by ``tests/processes/test_signal_ownership.py``, which checks the outcome against the
contract in the signal table of docs/guide/lifecycle.md. The signal is sent by the process to
itself from inside the funnel, at the worst places, so every run takes the same path:

- ``training``: inside ``log()``, while the first full batch is being encoded for sending;
- ``send``: inside ``log()``, once that batch is numbered and parked, as it goes to the socket;
- ``finish`` / ``exit``: inside the stream's close, while it waits for the logger's receipt,
  during the program's own ``finish()`` or, with no ``finish()``, the funnel's exit hooks.

The soak's ``report-wandb7590`` scenario sends the signal from outside at random times.

    python signal_ownership.py --role owner --handler user --when after-log --land exit --sig TERM
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import wandb_funnel as wf
from wandb_funnel._constants import BATCH_RECORDS
from wandb_funnel._protocol import codec
from wandb_funnel._worker import stream

STEPS = BATCH_RECORDS + 20  # the first full batch is sent from inside log()
HANDLER_EXIT = 42  # the exit code the user's handler chooses


def report(**kw: Any) -> None:
    sys.stdout.write("REPORT " + json.dumps(kw) + "\n")
    sys.stdout.flush()


def users_handler(signum: int, frame: FrameType | None) -> None:
    """A preemption handler as users write them (wandb#7590): finish the run, pick a code."""
    report(handler=f"{os.getpid()}:{signum}")  # one line per run: the test counts them
    wf.finish(exit_code=0)
    sys.exit(HANDLER_EXIT)


def flag_handler(signum: int, frame: FrameType | None) -> None:
    """A handler that returns (Lightning's: set a flag, stop at the next step boundary)."""
    report(handler=f"{os.getpid()}:{signum}")


def install(handler: str, signum: int) -> None:
    if handler == "user":
        signal.signal(signum, users_handler)
    elif handler == "flag":
        signal.signal(signum, flag_handler)
    elif handler == "ignore":
        signal.signal(signum, signal.SIG_IGN)
    # "default": leave SIG_DFL (SIGTERM) or default_int_handler (SIGINT) in place


def install_composer(signum: int) -> None:
    """Lightning's signal connector: a handler that calls the one it found (here the funnel's
    hook, which chains the user's handler installed before the funnel)."""
    found = signal.getsignal(signum)
    assert callable(found)

    def composed(s: int, f: FrameType | None) -> None:
        report(composer=os.getpid())
        found(s, f)

    signal.signal(signum, composed)
    report(composer_installed=True)


def land_inside_funnel(land: str, signum: int) -> None:
    """Arrange for ``signum`` to hit this process once, at the chosen place in the funnel."""
    fired = [False]

    def fire() -> None:
        if not fired[0]:
            fired[0] = True
            report(fired=land)
            os.kill(os.getpid(), signum)

    if land == "send":
        from wandb_funnel._protocol import sockets

        send_within = sockets.ClientSocket.send_within

        def send_and_fire(self: sockets.ClientSocket, frame: bytes, timeout: float) -> bool:
            if len(frame) > 1000:  # a full batch, numbered and parked: the handler sends it
                fire()
            return send_within(self, frame, timeout)

        sockets.ClientSocket.send_within = send_and_fire  # type: ignore[method-assign]
    elif land == "training":
        encode: Callable[[int, list[bytes]], bytes] = codec.encode_batch

        def encode_and_fire(first: int, records: list[bytes]) -> bytes:
            if len(records) == BATCH_RECORDS:
                fire()
            return encode(first, records)

        codec.encode_batch = encode_and_fire  # type: ignore[assignment]
    else:
        await_ack = stream.Stream._await_ack

        def await_ack_and_fire(
            self: stream.Stream, deadline: float, restart_deadline: float | None = None
        ) -> int | None:
            fire()
            return await_ack(self, deadline, restart_deadline)

        stream.Stream._await_ack = await_ack_and_fire  # type: ignore[method-assign]


def train(args: argparse.Namespace, signum: int, loader: Any = None) -> None:
    """Log STEPS steps, installing the handler at ``--when``; finish unless landing at exit."""
    chain = args.handler == "chain"
    if args.when == "before-init" or chain:
        install("user" if chain else args.handler, signum)
    run = wf.init(project="signals") if args.role == "owner" else wf.init()
    if args.when == "after-init":
        install(args.handler, signum)
    batches = iter(loader) if loader is not None else None
    for step in range(STEPS):
        if batches is not None and step < 8:
            next(batches)  # a few only: the workers stay up, and log() still fills batches
        run.log({"c": step}, step=step)
        if step == 0 and args.when in ("after-log", "dataloader") and not chain:
            install(args.handler, signum)
        if step == 0 and chain:
            install_composer(signum)
        if step == 0:
            land_inside_funnel(args.land, signum)
            report(installed=_installed(signum))
    report(logged=STEPS)
    if args.land != "exit":
        wf.finish()
    report(returned=True, installed_end=_installed(signum))


def _installed(signum: int) -> bool:
    """Whether the handler this program installed last is the installed one."""
    current = signal.getsignal(signum)
    return current in (users_handler, flag_handler) or getattr(current, "__name__", "") == (
        "composed"
    )


def worker(args: argparse.Namespace) -> None:
    train(args, getattr(signal, f"SIG{args.sig}"))


def dataloader() -> Any:
    from torch.utils.data import DataLoader

    # Persistent workers, forked after init, running while the handler is installed.
    items: Any = list(range(4 * STEPS))  # a list serves as a map-style dataset
    return DataLoader(items, batch_size=1, num_workers=2, persistent_workers=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", choices=["owner", "worker"], required=True)
    parser.add_argument("--method", choices=["spawn", "fork", "forkserver"], default="spawn")
    parser.add_argument(
        "--handler", choices=["user", "flag", "chain", "default", "ignore"], default="user"
    )
    parser.add_argument(
        "--when",
        choices=["before-init", "after-init", "after-log", "dataloader"],
        default="after-init",
    )
    parser.add_argument("--land", choices=["training", "send", "finish", "exit"], required=True)
    parser.add_argument("--sig", choices=["TERM", "INT"], default="TERM")
    args = parser.parse_args()
    signum = getattr(signal, f"SIG{args.sig}")
    report(pid=os.getpid())
    if args.role == "owner":
        train(args, signum, dataloader() if args.when == "dataloader" else None)
        return
    with wf.Funnel(project="signals") as funnel:
        child = mp.get_context(args.method).Process(target=worker, args=(args,))
        child.start()
        child.join(60)
        report(child_exitcode=child.exitcode)
        if child.exitcode is None:
            child.kill()
            child.join()
    report(owner_done=True, stats=funnel.stats)


if __name__ == "__main__":
    main()
