"""The owner processes of tests/processes/test_semantics.py: what ends up in the run.

    python semantics.py SCENARIO      (``--help`` lists them)

Each prints what it saw as REPORT lines; the test reads those and the run's ``.wandb`` file.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from typing import Any

import msgpack
import numpy as np
import zmq
from _prelude import Scenarios, report

import wandb_funnel as wf
from wandb_funnel._protocol import codec
from wandb_funnel._protocol.messages import PROTOCOL_VERSION, Hello

scenario = Scenarios(__doc__)


# -- ranks logging the same keys, some rarely ----------------------------------------------


def rank_main(rank: int, barrier: Barrier, steps: int, every: int) -> None:
    run = wf.init(rank=rank)
    barrier.wait(60)
    for step in range(0, steps, every):
        run.log({"loss": float(rank * 10 + step), "tput": 1.0, f"only{rank}": step}, step=step)
    run.finish()


def launch(
    funnel: wf.Funnel, n: int, steps: int = 20, every: int = 1, rare: dict[int, int] | None = None
) -> list[int | None]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(n)
    procs = [
        ctx.Process(target=rank_main, args=(r, barrier, steps, (rare or {}).get(r, every)))
        for r in range(1, n + 1)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    return [p.exitcode for p in procs]


@scenario()
def auto_mode(args: argparse.Namespace) -> None:
    """3 ranks, 20 steps, tput reduced by sum; REPORT their exit codes."""
    with wf.Funnel(project="t", reduce={"tput": "sum"}) as funnel:
        codes = launch(funnel, 3)
    report(codes=codes)


@scenario()
def shared_mode(args: argparse.Namespace) -> None:
    """2 ranks, 5 steps, shared mode, loss reduced by max."""
    with wf.Funnel(project="t", run_mode="shared", reduce={"loss": "max"}) as funnel:
        launch(funnel, 2, steps=5)


@scenario()
def rare_rank(args: argparse.Namespace) -> None:
    """3 ranks, 200 steps; rank 3 logs every 50th step only."""
    with wf.Funnel(project="t", reorder_window=30) as funnel:
        launch(funnel, 3, steps=200, rare={3: 50})


# -- one worker ----------------------------------------------------------------------------


def late_child() -> None:
    wf.log({"late": 5}, step=5)


@scenario()
def late_record(args: argparse.Namespace) -> None:
    """Rows 0..19 written, then a worker logs at step 5."""
    with wf.Funnel(project="t", reorder_window=0.1) as funnel:
        for s in range(20):
            funnel.log({"x": s}, step=s)
        funnel.run.flush()
        time.sleep(1.0)  # rows 0..19 are written
        p = mp.get_context("spawn").Process(target=late_child)
        p.start()
        p.join(60)
    report(stats=funnel.stats)


def config_child() -> None:
    run = wf.init(config={"worker_seed": 7})
    run.summary["worker_best"] = 0.9
    run.config.update({"lr": 0.01})
    run.finish()


@scenario()
def worker_config_and_summary(args: argparse.Namespace) -> None:
    """A worker's init config, config update and summary."""
    with wf.Funnel(project="t", config={"owner": "yes"}):
        p = mp.get_context("spawn").Process(target=config_child)
        p.start()
        p.join(60)


def bad_input_child(q: Queue[list[str]]) -> None:
    errors = []
    bad_calls: tuple[Any, ...] = (  # wrong on purpose
        {1: 2},
        {"k": object()},
        {"k": np.zeros(3)},
        "notadict",
        {"s": "x" * 2000},
    )
    for bad in bad_calls:
        try:
            wf.log(bad)
        except (TypeError, ValueError) as e:
            errors.append(str(e))
    try:
        wf.log({"x": 1}, step=-1)
    except ValueError as e:
        errors.append(str(e))
    wf.log({"child_ok": 1}, step=0)
    q.put(errors)


@scenario()
def bad_input(args: argparse.Namespace) -> None:
    """A worker's bad log() calls (REPORT their errors), then good ones from both sides."""
    with wf.Funnel(project="t", max_record_bytes=1000) as funnel:
        ctx = mp.get_context("spawn")
        q: Queue[list[str]] = ctx.Queue()
        p = ctx.Process(target=bad_input_child, args=(q,))
        p.start()
        errors = q.get(timeout=60)
        p.join(60)
        funnel.log({"owner_ok": 1}, step=0)
    report(errors=errors)


@scenario()
def junk_on_the_socket(args: argparse.Namespace) -> None:
    """Malformed frames, frames with no hello, and a hello with the wrong token."""
    with wf.Funnel(project="t") as funnel:
        funnel.log({"before": 1}, step=0)
        ctx = zmq.Context()
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 2000)
        s.connect(funnel.address)
        s.send(b"\xc1garbage")  # not msgpack
        s.send(
            msgpack.packb([PROTOCOL_VERSION, 2, 0, 1]) + msgpack.packb([0, True, {"evil": 1}])
        )  # no hello
        # a well-formed hello (the codec's own: the wire's current shape) with a wrong token
        s.send(codec.encode_hello(Hello("wrong-token", os.getpid(), "h", None)))
        s.send(msgpack.packb([PROTOCOL_VERSION, 2, 0, 1]) + msgpack.packb([0, True, {"evil": 2}]))
        s.send_multipart([b"a", b"b"])  # two frames
        s.close()
        ctx.term()
        time.sleep(0.5)
        funnel.log({"after": 1}, step=1)
    report(stats=funnel.stats)


if __name__ == "__main__":
    scenario.main()
