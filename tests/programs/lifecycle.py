"""The owner processes of tests/processes/test_lifecycle.py: every exit path, one scenario each.

    python lifecycle.py SCENARIO [options]      (``--help`` lists them)

Each prints what it saw as REPORT lines; the test reads those and the run's ``.wandb`` file.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event, Lock
from types import FrameType
from typing import Any

import psutil
from _prelude import Scenarios, option, report

import wandb_funnel as wf
from wandb_funnel._constants import BATCH_RECORDS
from wandb_funnel._protocol import codec
from wandb_funnel._worker import stream

scenario = Scenarios(__doc__)


def logger_pid(funnel: wf.Funnel) -> int:
    pid = funnel.logger_pid
    assert pid is not None, "the funnel is not started"
    return pid


@scenario()
def exception_in_block(args: argparse.Namespace) -> None:
    """An exception leaves the with-block, after 50 records."""
    with wf.Funnel(project="t"):
        for s in range(50):
            wf.log({"x": s})
        raise RuntimeError("boom")


@scenario(option("--code", type=int, required=True))
def close_with_code(args: argparse.Namespace) -> None:
    """Log, close with --code; report the logger process's own exit code."""
    funnel = wf.Funnel(project="t").start()
    funnel.log({"x": 1})
    funnel.close(args.code)
    assert funnel._logger is not None
    report(logger_exit=funnel._logger.returncode, run_exit=funnel.exit_code)


@scenario(option("--ending", choices=["pass", "raise", "exit"], required=True))
def no_close_atexit(args: argparse.Namespace) -> None:
    """wf.init() and 30 records, no close(): the program ends as --ending says."""
    run = wf.init(project="t")
    for s in range(30):
        run.log({"x": s})
    if args.ending == "raise":
        raise ValueError("x")
    if args.ending == "exit":
        sys.exit(3)


@scenario()
def private_funnel_is_like_wandb_init(args: argparse.Namespace) -> None:
    """wf.init() with no funnel around: wandb's step rules, summary, config, finish()."""
    run = wf.init(project="t", config={"lr": 0.5}, rank_scope="global")  # scope: no-op here
    run.log({"a": 1})
    run.log({"a": 2}, commit=False)
    run.log({"b": 3})
    run.log({"c": 4}, step=5)
    run.log({"c": 5}, step=5)
    run.log({"d": 6})
    run.summary["best"] = 9
    run.config.update({"extra": True})
    report(rank=run.rank, id=run.id)
    run.finish()
    report(after_env=os.environ.get("_WANDB_FUNNEL_ADDRESS"))


# -- a Pool of workers logging steadily until they are told (or forced) to stop -------------


def work(n: int) -> None:
    for step in range(n * 1000, n * 1000 + 1000):
        wf.log({"w": n}, step=step)
        time.sleep(0.002)


def start(**kw: Any) -> wf.Funnel:
    funnel = wf.Funnel(project="t", close_timeout=20, **kw).start()
    report(logger_pid=funnel.logger_pid, address=funnel.address)
    return funnel


@scenario()
def signal_mid_run(args: argparse.Namespace) -> None:
    """Two spawn Pool workers log steadily; REPORT ready, then wait for the test's signal."""
    start()  # open until the program ends: its exit hook closes it
    pool = mp.get_context("spawn").Pool(2)
    r = pool.map_async(work, range(2))
    time.sleep(1.0)
    report(ready=True)
    r.get(60)


# -- workers and their signals --------------------------------------------------------------


def child_with_disposition(ready: Event, own_handler: bool) -> None:
    if own_handler:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(7))
    for s in range(100):
        wf.log({"c": s}, step=s)
    ready.set()
    time.sleep(60)


@scenario(option("--own-handler", action="store_true"))
def worker_keeps_its_signal_disposition(args: argparse.Namespace) -> None:
    """A spawn worker logs 100 records, then is terminated; REPORT its exit code."""
    with wf.Funnel(project="t"):
        ctx = mp.get_context("spawn")
        ready = ctx.Event()
        p = ctx.Process(target=child_with_disposition, args=(ready, args.own_handler))
        p.start()
        ready.wait(60)
        p.terminate()
        p.join(30)
    report(exitcode=p.exitcode)


def child_held_in_sem_wait(ready: Event, held: Lock) -> None:
    for s in range(50):
        wf.log({"c": s}, step=s)
    ready.set()

    def sigterm_this_thread() -> None:
        time.sleep(0.5)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

    threading.Thread(target=sigterm_this_thread).start()
    held.acquire()  # sem_wait on a lock the parent holds: only a signal can end this


@scenario(option("--method", choices=["spawn", "fork"], required=True))
def sigterm_that_misses_the_main_thread(args: argparse.Namespace) -> None:
    """A worker blocked in sem_wait gets SIGTERM on a helper thread; REPORT its exit code."""
    with wf.Funnel(project="t"):
        ctx = mp.get_context(args.method)
        ready, held = ctx.Event(), ctx.Lock()
        held.acquire()
        p = ctx.Process(target=child_held_in_sem_wait, args=(ready, held))
        p.start()
        ready.wait(60)
        p.join(30)
        report(exitcode=p.exitcode)
        if p.exitcode is None:
            p.kill()
            p.join()


def child_killed_mid_send(chained: bool) -> None:
    wf.log({"c": 0}, step=0)  # attached: our hook is installed
    if chained:
        ours = signal.getsignal(signal.SIGTERM)
        assert callable(ours)

        def users(signum: int, frame: FrameType | None) -> None:
            print("USER_HANDLER", flush=True)
            ours(signum, frame)
            sys.exit(143)

        signal.signal(signal.SIGTERM, users)
    encode = codec.encode_batch
    fired: list[int] = []

    def encode_and_get_killed(first_seq: int, packed_records: list[bytes]) -> bytes:
        # The first full batch, from log():
        if len(packed_records) == BATCH_RECORDS and not fired:
            fired.append(1)
            os.kill(os.getpid(), signal.SIGTERM)
        return encode(first_seq, packed_records)

    codec.encode_batch = encode_and_get_killed
    for s in range(1, 2 * BATCH_RECORDS):
        wf.log({"c": s}, step=s)
    time.sleep(60)  # not reached: SIGTERM ends us once the batch is out


@scenario(option("--chained", action="store_true"))
def sigterm_during_a_batch_send(args: argparse.Namespace) -> None:
    """A spawn worker SIGTERMs itself from inside its first full batch's encoding."""
    with wf.Funnel(project="t") as funnel:
        p = mp.get_context("spawn").Process(target=child_killed_mid_send, args=(args.chained,))
        p.start()
        p.join(60)
    report(exitcode=p.exitcode, stats=funnel.stats)


# -- close() and ranks that are late, dead or elsewhere ------------------------------------


def straggler(attached: Event) -> None:
    wf.log({"c": 0}, step=0)
    wf.init().rank  # noqa: B018  (reading the rank waits until the logger welcomed us)
    attached.set()
    for s in range(1, 40):
        time.sleep(0.03)
        wf.log({"c": s}, step=s)
    wf.finish()


@scenario()
def close_waits_for_a_straggler(args: argparse.Namespace) -> None:
    """close() while a spawn worker still logs a record every 30 ms."""
    funnel = wf.Funnel(project="t").start()
    ctx = mp.get_context("spawn")
    attached = ctx.Event()
    p = ctx.Process(target=straggler, args=(attached,))
    p.start()
    attached.wait(60)
    t = time.monotonic()
    funnel.close()
    report(close_s=time.monotonic() - t)
    p.join(30)


def child_killed_after_flush(ready: Event) -> None:
    for s in range(10):
        wf.log({"c": s}, step=s)
    wf.init().flush()
    ready.set()
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)


@scenario()
def dead_worker_is_not_waited_for(args: argparse.Namespace) -> None:
    """A spawn worker SIGKILLs itself after 10 flushed records; REPORT close()'s duration."""
    funnel = wf.Funnel(project="t", close_timeout=30).start()
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    p = ctx.Process(target=child_killed_after_flush, args=(ready,))
    p.start()
    ready.wait(60)
    t = time.monotonic()
    funnel.close()
    report(close_s=time.monotonic() - t)
    p.join(5)


@scenario(option("--max-restarts", type=int, default=3))
def logger_death_does_not_fail_training(args: argparse.Namespace) -> None:
    """The logger is SIGKILLed mid-run; training logs on."""
    with wf.Funnel(project="t", max_logger_restarts=args.max_restarts) as funnel:
        for s in range(20):
            funnel.log({"x": s})
        os.kill(logger_pid(funnel), signal.SIGKILL)
        time.sleep(0.3)
        for s in range(20, 5000):
            funnel.log({"x": s})
        report(trained=True)


@scenario()
def owner_killed(args: argparse.Namespace) -> None:
    """100 records flushed; REPORT the logger's pid, then wait for the test's SIGKILL."""
    funnel = wf.Funnel(project="t").start()
    for s in range(100):
        funnel.log({"x": s})
    funnel.run.flush()
    time.sleep(2.5)
    report(address=funnel.address, logger_pid=funnel.logger_pid)
    time.sleep(60)


def wandb_cores() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if "wandb-core" in p.name()]


@scenario()
def stalled_wandb_finish(args: argparse.Namespace) -> None:
    """wandb-core SIGSTOPped, then close(); REPORT how long it took."""
    funnel = wf.Funnel(project="t", close_timeout=3).start()
    funnel.log({"x": 1})
    core = wandb_cores()
    for c in core:
        c.suspend()
    t = time.monotonic()
    funnel.close()
    report(close_s=time.monotonic() - t, cores=len(core))
    for c in core:
        c.resume()


@scenario()
def logger_crash_loses_at_most_a_second(args: argparse.Namespace) -> None:
    """200 records, 4.5 s, then the logger is SIGKILLed."""
    funnel = wf.Funnel(project="t").start()
    for s in range(200):
        funnel.log({"x": s})
    funnel.run.flush()
    time.sleep(4.5)  # reorder window (2 s) + flush interval (1 s) + slack
    os.kill(logger_pid(funnel), signal.SIGKILL)
    time.sleep(0.2)
    funnel.close()


@scenario()
def funnels_one_after_another(args: argparse.Namespace) -> None:
    """Two funnels in turn, 3 records each; REPORT the records still buffered after 0.5 s."""
    pending = []
    for i in range(2):
        with wf.Funnel(project="t", name=f"run{i}") as funnel:
            for s in range(3):
                funnel.log({"i": i}, step=s)
            time.sleep(0.5)
            pending.append(sum(len(st._buf) for st in stream.open_streams()))
    report(pending=pending)


def burst(i: int) -> None:
    run = wf.init()
    for s in range(30000):
        run.log({"v": float(s)}, step=s)
    run.finish()


@scenario()
def backlog_at_exit(args: argparse.Namespace) -> None:
    """3 spawn workers log 30,000 records each and exit at once."""
    with wf.Funnel(project="t", close_timeout=60) as funnel:
        ctx = mp.get_context("spawn")
        ps = [ctx.Process(target=burst, args=(i,)) for i in range(3)]
        for p in ps:
            p.start()
        for p in ps:
            p.join(120)
    report(stats=funnel.stats, codes=[p.exitcode for p in ps])


@scenario()
def logger_watchdog(args: argparse.Namespace) -> None:
    """REPORT the logger's and wandb-core's pids, then wait for the test to stall and kill."""
    funnel = wf.Funnel(project="t", close_timeout=3).start()
    funnel.log({"x": 1})
    core = [p.pid for p in wandb_cores()]
    report(logger_pid=funnel.logger_pid, core=core)
    time.sleep(60)


def timed_init(q: Queue[float]) -> None:
    t = time.monotonic()
    run = wf.init()
    run.log({"x": 1})
    q.put(time.monotonic() - t)


@scenario()
def init_does_not_wait_on_a_dead_logger(args: argparse.Namespace) -> None:
    """The logger SIGKILLed, then a spawn worker's init(); REPORT how long it took."""
    funnel = wf.Funnel(project="t").start()
    os.kill(logger_pid(funnel), signal.SIGKILL)
    time.sleep(0.3)
    ctx = mp.get_context("spawn")
    q: Queue[float] = ctx.Queue()
    p = ctx.Process(target=timed_init, args=(q,))
    p.start()
    report(init_s=q.get(timeout=60))
    p.join(30)
    funnel.close()


def remote(ready: Event, quiet_s: float, die: bool) -> None:
    stream._HOSTNAME = "another-node"  # as if this rank ran elsewhere
    run = wf.init()
    run.log({"c": 0}, step=0)
    run.flush()
    ready.set()
    time.sleep(quiet_s)
    if die:
        os.kill(os.getpid(), signal.SIGKILL)
    run.log({"c": 1}, step=1)
    run.finish()


@scenario()
def remote_rank_heartbeats_and_death(args: argparse.Namespace) -> None:
    """Two "remote" ranks: one quiet for 8 s, one SIGKILLed; REPORT close()'s duration."""
    funnel = wf.Funnel(project="t", close_timeout=60).start()
    ctx = mp.get_context("spawn")
    r1, r2 = ctx.Event(), ctx.Event()
    quiet = ctx.Process(target=remote, args=(r1, 8, False))
    dying = ctx.Process(target=remote, args=(r2, 0.5, True))
    quiet.start()
    dying.start()
    r1.wait(60)
    r2.wait(60)
    t = time.monotonic()
    funnel.close()
    report(close_s=time.monotonic() - t, stats=funnel.stats)
    quiet.join(10)
    dying.join(10)


def row_flood() -> None:
    run = wf.init()
    for s in range(40000):
        run.log({"v": 1.0}, step=s)
    run.finish()


@scenario()
def close_with_a_row_backlog(args: argparse.Namespace) -> None:
    """40,000 rows from a spawn worker, then close() with close_timeout=6."""
    funnel = wf.Funnel(project="t", close_timeout=6).start()
    p = mp.get_context("spawn").Process(target=row_flood)
    p.start()
    p.join(60)
    t = time.monotonic()
    funnel.close()
    report(close_s=time.monotonic() - t, stats=funnel.stats)


@scenario(option("--rows", type=int, default=20_000))
def slow_close(args: argparse.Namespace) -> None:
    """The owner logs ``--rows`` rows flat out and closes at once: the logger is far behind
    (wandb writes about 5,000 rows a second), so the close takes seconds."""
    with wf.Funnel(project="t", close_timeout=120) as funnel:
        for s in range(args.rows):
            funnel.log({"x": s}, step=s)
    report(stats=funnel.stats)


if __name__ == "__main__":
    scenario.main()
