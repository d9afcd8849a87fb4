"""Every exit path ends in bounded time, finishes the run with the right exit code, loses
nothing it could have kept, and leaves no process or socket file behind."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from tests.conftest import PRELUDE, Scripts, reports, wait_for_report
from tests.wandb_reader import only_run
from wandb_funnel._constants import BATCH_RECORDS

pytestmark = pytest.mark.processes

# A Pool of workers logging steadily until they are told (or forced) to stop.
STEADY = (
    PRELUDE
    + """
def work(n):
    for step in range(n * 1000, n * 1000 + 1000):
        wf.log({"w": n}, step=step)
        time.sleep(0.002)

def start(**kw):
    funnel = wf.Funnel(project="t", close_timeout=20, **kw).start()
    report(logger_pid=funnel.logger_pid, address=funnel.address)
    return funnel
"""
)


def test_exception_in_block_exits_1(scripts: Scripts) -> None:
    """An exception leaving the with-block finishes the run with exit code 1, after draining."""
    res = scripts.run(
        PRELUDE
        + """
if __name__ == "__main__":
    with wf.Funnel(project="t"):
        for s in range(50):
            wf.log({"x": s})
        raise RuntimeError("boom")
"""
    )
    assert res.returncode == 1 and "boom" in res.stderr
    run = only_run(scripts.wandb_dir)
    assert run.exit_code == 1
    assert [r["global_step"] for r in run.history] == list(range(50))
    assert res.leftovers == []


@pytest.mark.parametrize(
    ("ending", "code"), [("pass", 0), ("raise ValueError('x')", 1), ("sys.exit(3)", 3)]
)
def test_no_close_atexit(scripts: Scripts, ending: str, code: int) -> None:
    """Without close(), interpreter exit drains and finishes the run with the right code."""
    res = scripts.run(
        PRELUDE
        + f"""
if __name__ == "__main__":
    run = wf.init(project="t")
    for s in range(30):
        run.log({{"x": s}})
    {ending}
"""
    )
    run = only_run(scripts.wandb_dir)
    assert run.exit_code == code
    assert len(run.history) == 30
    assert res.leftovers == []


def test_private_funnel_is_like_wandb_init(scripts: Scripts) -> None:
    """wf.init() with no funnel around owns a private one; finish() ends the run."""
    res = scripts.run(
        PRELUDE
        + """
if __name__ == "__main__":
    run = wf.init(project="t", config={"lr": 0.5}, rank_scope="global")  # scope: no-op here
    run.log({"a": 1}); run.log({"a": 2}, commit=False); run.log({"b": 3})
    run.log({"c": 4}, step=5); run.log({"c": 5}, step=5); run.log({"d": 6})
    run.summary["best"] = 9
    run.config.update({"extra": True})
    report(rank=run.rank, id=run.id)
    run.finish()
    report(after_env=os.environ.get("WANDB_FUNNEL_ADDRESS"))
"""
    )
    assert res.returncode == 0, res.stderr
    info = reports(res.stdout)
    run = only_run(scripts.wandb_dir)
    assert info["rank"] == 0 and info["id"] == run.run_id
    assert info["after_env"] is None
    rows = [{k: v for k, v in r.items() if not k.startswith("_")} for r in run.history]
    # wandb's step rules per rank: commit=False accumulates; an explicit step stays open.
    assert rows == [
        {"a": 1, "global_step": 0},
        {"a": 2, "b": 3, "global_step": 1},
        {"c": 5, "d": 6, "global_step": 5},
    ]
    assert run.summary["best"] == 9
    assert run.config["lr"] == 0.5 and run.config["extra"] is True


@pytest.mark.parametrize("target", ["owner", "group"])
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_mid_run(scripts: Scripts, target: str, signum: int, code: int) -> None:
    """Ctrl-C (SIGINT) or SIGTERM (a scheduler, torchrun's killpg), to the owner or to its
    whole process group: the run is drained and finished with 130 / 143, the owner still
    ends the way the signal would have ended it, workers' records are kept, and everything
    exits in bounded time."""
    proc = scripts.start(
        STEADY
        + """
if __name__ == "__main__":
    funnel = start()
    pool = mp.get_context("spawn").Pool(2)
    r = pool.map_async(work, range(2))
    time.sleep(1.0)
    report(ready=True)
    r.get(60)
"""
    )
    t0 = time.monotonic()
    wait_for_report(proc, "ready")
    time.sleep(0.5)
    if target == "owner":
        proc.send_signal(signum)
    else:
        os.killpg(proc.pid, signum)
    res = scripts.finish(proc, 60, t0)
    if signum == signal.SIGINT:
        assert res.returncode != 0 and "KeyboardInterrupt" in res.stderr
    else:
        assert res.returncode == -signal.SIGTERM
    run = only_run(scripts.wandb_dir)
    assert run.exit_code == code
    assert run.summary["funnel/records"] > 0
    if target == "group" and signum == signal.SIGTERM:
        # Workers flushed on their own SIGTERM: both ranks' records are in the run.
        assert {v for _, v in run.column("w")} == {0, 1}
    assert res.leftovers == []


@pytest.mark.parametrize("own_handler", [False, True])
def test_worker_keeps_its_signal_disposition(scripts: Scripts, own_handler: bool) -> None:
    """SIGTERM is never swallowed: a worker that would die of it still dies of it, and a
    worker's own handler still runs (here it exits with 7); either way the records it logged
    before the signal are flushed into the run first."""
    res = scripts.run(PRELUDE + f"""
def child(ready):
    if {own_handler}:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(7))
    for s in range(100):
        wf.log({{"c": s}}, step=s)
    ready.set()
    time.sleep(60)

if __name__ == "__main__":
    with wf.Funnel(project="t") as funnel:
        ctx = mp.get_context("spawn")
        ready = ctx.Event()
        p = ctx.Process(target=child, args=(ready,))
        p.start()
        ready.wait(60)
        p.terminate(); p.join(30)
    report(exitcode=p.exitcode)
""")
    assert res.returncode == 0, res.stderr
    assert reports(res.stdout)["exitcode"] == (7 if own_handler else -signal.SIGTERM)
    run = only_run(scripts.wandb_dir)
    assert [s for s, _ in run.column("c")] == list(range(100))


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_sigterm_that_misses_the_main_thread_still_runs_its_handler(
    scripts: Scripts, method: str
) -> None:
    """CPython runs a Python handler only on the main thread, at its next bytecode or EINTR.
    A SIGTERM taken by another thread while the main thread sleeps in sem_wait (a Pool worker
    idle in SimpleQueue.get() when Pool.terminate() signals it) used to leave the handler
    pending forever, and terminate() hung. Here the signal goes to a helper thread on
    purpose: the worker must still flush its records and die of SIGTERM."""
    res = scripts.run(PRELUDE + f"""
import threading

def child(ready, held):
    for s in range(50):
        wf.log({{"c": s}}, step=s)
    ready.set()
    threading.Thread(target=lambda: (time.sleep(0.5),
                     signal.pthread_kill(threading.get_ident(), signal.SIGTERM))).start()
    held.acquire()  # sem_wait on a lock the parent holds: only a signal can end this

if __name__ == "__main__":
    with wf.Funnel(project="t") as funnel:
        ctx = mp.get_context("{method}")
        ready, held = ctx.Event(), ctx.Lock()
        held.acquire()
        p = ctx.Process(target=child, args=(ready, held))
        p.start()
        ready.wait(60)
        p.join(30)
        report(exitcode=p.exitcode)
        if p.exitcode is None:
            p.kill(); p.join()
""")
    assert res.returncode == 0, res.stderr
    assert reports(res.stdout)["exitcode"] == -signal.SIGTERM
    run = only_run(scripts.wandb_dir)
    assert [s for s, _ in run.column("c")] == list(range(50))
    assert res.leftovers == []


@pytest.mark.parametrize("chained", [False, True])
def test_sigterm_during_a_batch_send_loses_nothing(scripts: Scripts, chained: bool) -> None:
    """SIGTERM whose handler would run in the middle of a batch send (here it is raised from
    inside the send, at the worst moment): the batch still goes out before the shutdown, so
    every record logged reaches the run and none is counted as dropped. A handler the user
    installed after ours, chaining to it (Lightning, submitit), runs exactly once and decides
    how the process ends: ours, called by it, only flushes."""
    res = scripts.run(PRELUDE + f"""
from wandb_funnel._protocol import codec
from wandb_funnel._constants import BATCH_RECORDS

def child():
    wf.log({{"c": 0}}, step=0)  # attached: our hook is installed
    if {chained}:
        ours = signal.getsignal(signal.SIGTERM)
        def users(signum, frame):
            print("USER_HANDLER", flush=True)
            ours(signum, frame)
            sys.exit(143)
        signal.signal(signal.SIGTERM, users)
    encode = codec.encode_batch
    fired = []
    def encode_and_get_killed(first, records):
        if len(records) == BATCH_RECORDS and not fired:  # the first full batch, from log()
            fired.append(1)
            os.kill(os.getpid(), signal.SIGTERM)
        return encode(first, records)
    codec.encode_batch = encode_and_get_killed
    for s in range(1, 2 * BATCH_RECORDS):
        wf.log({{"c": s}}, step=s)
    time.sleep(60)  # not reached: SIGTERM ends us once the batch is out

if __name__ == "__main__":
    with wf.Funnel(project="t") as funnel:
        p = mp.get_context("spawn").Process(target=child)
        p.start()
        p.join(60)
    report(exitcode=p.exitcode, stats=funnel.stats)
""")
    assert res.returncode == 0, res.stderr
    info = reports(res.stdout)
    assert info["exitcode"] == (143 if chained else -signal.SIGTERM)
    run = only_run(scripts.wandb_dir)
    # The SIGTERM landed at the batch's last log(): that whole batch was logged, then it died.
    assert [s for s, _ in run.column("c")] == list(range(BATCH_RECORDS))
    assert run.summary["funnel/dropped_records"] == 0
    assert res.stdout.count("USER_HANDLER") == (1 if chained else 0)
    assert res.leftovers == []


def test_close_waits_for_a_straggler(scripts: Scripts) -> None:
    """close() waits (bounded) for a rank still logging, so its last records are not cut."""
    res = scripts.run(
        PRELUDE
        + """
def child(attached):
    wf.log({"c": 0}, step=0)
    wf.init().rank  # wait until the logger has welcomed us
    attached.set()
    for s in range(1, 40):
        time.sleep(0.03)
        wf.log({"c": s}, step=s)
    wf.finish()

if __name__ == "__main__":
    funnel = wf.Funnel(project="t").start()
    ctx = mp.get_context("spawn")
    attached = ctx.Event()
    p = ctx.Process(target=child, args=(attached,))
    p.start()
    attached.wait(60)
    t = time.monotonic()
    funnel.close()
    report(close_s=time.monotonic() - t)
    p.join(30)
"""
    )
    assert res.returncode == 0, res.stderr
    run = only_run(scripts.wandb_dir)
    assert [s for s, _ in run.column("c")] == list(range(40))
    assert run.summary["funnel/dropped_records"] == 0


def test_dead_worker_is_not_waited_for(scripts: Scripts) -> None:
    """A worker SIGKILLed mid-run is noticed: close() does not wait on it, the run's exit code
    stays the owner's (0), and the death is counted in the summary."""
    res = scripts.run(
        PRELUDE
        + """
def child(ready):
    for s in range(10):
        wf.log({"c": s}, step=s)
    wf.init().flush()
    ready.set()
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)

if __name__ == "__main__":
    funnel = wf.Funnel(project="t", close_timeout=30).start()
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    p = ctx.Process(target=child, args=(ready,))
    p.start(); ready.wait(60)
    t = time.monotonic()
    funnel.close()
    report(close_s=time.monotonic() - t)
    p.join(5)
"""
    )
    assert res.returncode == 0, res.stderr
    info = reports(res.stdout)
    assert info["close_s"] < 15  # well below the 15 s a straggler could get
    run = only_run(scripts.wandb_dir)
    assert run.exit_code == 0
    assert run.summary["funnel/dead_ranks"] == 1
    assert [s for s, _ in run.column("c")] == list(range(10))
    assert "died without finishing" in res.stderr


def test_logger_death_does_not_fail_training(scripts: Scripts) -> None:
    """If the logger dies, training goes on, the owner exits with its own status, and a
    warning says what was lost; nothing hangs."""
    res = scripts.run(
        PRELUDE
        + """
if __name__ == "__main__":
    with wf.Funnel(project="t") as funnel:
        for s in range(20):
            funnel.log({"x": s})
        os.kill(funnel.logger_pid, signal.SIGKILL)
        time.sleep(0.3)
        for s in range(20, 5000):
            funnel.log({"x": s})
        report(trained=True)
"""
    )
    assert res.returncode == 0, res.stderr
    assert reports(res.stdout)["trained"]
    assert "logger" in res.stderr and "exited" in res.stderr
    assert res.elapsed < 60
    assert res.leftovers == []


def test_owner_killed_logger_exits_by_itself(scripts: Scripts) -> None:
    """SIGKILL to the owner: the logger notices and exits by itself, removing the socket
    directory; no process of the job is left. wandb-core exits with its parent (the owner),
    so the run keeps what wandb flushed (all rows logged over a second before the kill) and
    has no exit record: the documented cost of a hard kill of the owner."""
    proc = scripts.start(
        PRELUDE
        + """
if __name__ == "__main__":
    funnel = wf.Funnel(project="t").start()
    for s in range(100):
        funnel.log({"x": s})
    funnel.run.flush()
    time.sleep(2.5)
    report(address=funnel.address, logger_pid=funnel.logger_pid)
    time.sleep(60)
"""
    )
    t0 = time.monotonic()
    info = wait_for_report(proc, "logger_pid")
    proc.kill()
    res = scripts.finish(proc, 30, t0)
    logger = info["logger_pid"]
    deadline = time.monotonic() + 30
    while psutil.pid_exists(logger) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not psutil.pid_exists(logger) or psutil.Process(logger).status() == "zombie"
    run = only_run(scripts.wandb_dir)
    assert [r["global_step"] for r in run.history] == list(range(100))
    assert not os.path.exists(os.path.dirname(info["address"][len("ipc://") :]))
    assert res.leftovers == []


def test_stalled_wandb_finish_is_bounded(scripts: Scripts) -> None:
    """If wandb-core stalls (SIGSTOPped), close() still returns within close_timeout plus
    the kill grace, kills the logger and warns that the run may be incomplete."""
    res = scripts.run(
        PRELUDE
        + """
import psutil
if __name__ == "__main__":
    funnel = wf.Funnel(project="t", close_timeout=3).start()
    funnel.log({"x": 1})
    core = [p for p in psutil.Process().children(recursive=True) if "wandb-core" in p.name()]
    for c in core:
        c.suspend()
    t = time.monotonic()
    funnel.close()
    report(close_s=time.monotonic() - t, cores=len(core))
    for c in core:
        c.resume()
"""
    )
    assert res.returncode == 0, res.stderr
    info = reports(res.stdout)
    assert info["cores"] >= 1
    assert info["close_s"] < 3 + 2 * 2 + 1  # close_timeout + terminate/kill grace + slack
    assert "did not finish the run within close_timeout" in res.stderr
    assert res.leftovers == []


def test_logger_crash_loses_at_most_a_second(scripts: Scripts) -> None:
    """With the short transaction-log flush, rows written >1 s before a logger SIGKILL are
    on disk (wandb's default would keep them in memory for up to 15 s)."""
    res = scripts.run(
        PRELUDE
        + """
if __name__ == "__main__":
    funnel = wf.Funnel(project="t").start()
    for s in range(200):
        funnel.log({"x": s})
    funnel.run.flush()
    time.sleep(4.5)  # reorder window (2 s) + flush interval (1 s) + slack
    os.kill(funnel.logger_pid, signal.SIGKILL)
    time.sleep(0.2)
    funnel.close()
"""
    )
    assert res.returncode == 0, res.stderr
    run = only_run(scripts.wandb_dir)
    assert [r["global_step"] for r in run.history] == list(range(200))


def test_funnels_one_after_another_in_one_process(scripts: Scripts) -> None:
    """A process can own one funnel after another: each run is complete, and the flusher
    thread serves the second funnel too (a part-filled batch leaves within 0.1 s)."""
    res = scripts.run(PRELUDE + """
from wandb_funnel._worker import stream
if __name__ == "__main__":
    pending = []
    for i in range(2):
        with wf.Funnel(project="t", name=f"run{i}") as funnel:
            for s in range(3):
                funnel.log({"i": i}, step=s)
            time.sleep(0.5)
            pending.append(sum(len(st._buf) for st in stream.open_streams()))
    report(pending=pending)
""")
    assert res.returncode == 0, res.stderr
    assert reports(res.stdout)["pending"] == [0, 0]
    from tests.wandb_reader import find_runs

    runs = find_runs(scripts.wandb_dir)
    assert len(runs) == 2
    assert sorted(len(r.history) for r in runs) == [3, 3]
    assert all(r.exit_code == 0 for r in runs)
    assert res.leftovers == []


def test_backlog_at_exit_is_delivered_or_counted(scripts: Scripts) -> None:
    """Workers that log a burst and exit at once leave the logger behind: every record still
    ends up in the run or counted as dropped, and no finished rank is mistaken for dead."""
    res = scripts.run(PRELUDE + """
def child(i):
    run = wf.init()
    for s in range(30000):
        run.log({"v": float(s)}, step=s)
    run.finish()

if __name__ == "__main__":
    with wf.Funnel(project="t", close_timeout=60) as funnel:
        ctx = mp.get_context("spawn")
        ps = [ctx.Process(target=child, args=(i,)) for i in range(3)]
        for p in ps: p.start()
        for p in ps: p.join(120)
    report(stats=funnel.stats, codes=[p.exitcode for p in ps])
""", timeout=150)
    assert res.returncode == 0, res.stderr
    info = reports(res.stdout)
    stats = info["stats"]
    assert info["codes"] == [0, 0, 0]
    assert stats["funnel/records"] + stats["funnel/dropped_records"] == 90000
    assert stats["funnel/dead_ranks"] == 0
    assert "died without finishing" not in res.stderr
    run = only_run(scripts.wandb_dir)
    assert run.summary["funnel/records"] == stats["funnel/records"]


def test_logger_watchdog_when_owner_dies_and_wandb_stalls(scripts: Scripts) -> None:
    """Owner SIGKILLed while wandb-core is stalled: nobody is left to kill the logger, so it
    ends itself once its budget is spent (close_timeout plus a grace); nothing outlives it."""
    proc = scripts.start(PRELUDE + """
import psutil
if __name__ == "__main__":
    funnel = wf.Funnel(project="t", close_timeout=3).start()
    funnel.log({"x": 1})
    core = [p.pid for p in psutil.Process().children(recursive=True) if "wandb-core" in p.name()]
    report(logger_pid=funnel.logger_pid, core=core)
    time.sleep(60)
""")
    t0 = time.monotonic()
    info = wait_for_report(proc, "logger_pid")
    cores = [psutil.Process(pid) for pid in info["core"]]
    try:
        for core in cores:
            core.suspend()
        proc.kill()
        proc.wait(10)  # not communicate(): the stopped wandb-core holds the output pipes
        killed_at = time.monotonic()
        logger = info["logger_pid"]
        while psutil.pid_exists(logger) and time.monotonic() - killed_at < 20:
            if psutil.Process(logger).status() == psutil.STATUS_ZOMBIE:
                break
            time.sleep(0.1)
        gone_after = time.monotonic() - killed_at
    finally:
        for core in cores:
            try:
                core.resume()
            except psutil.Error:
                pass
    res = scripts.finish(proc, 30, t0)
    assert gone_after < 3 + 1 + 2  # budget + watchdog grace + detection slack
    assert "could not finish the run within its" in res.stderr
    assert res.leftovers == []


def test_init_does_not_wait_on_a_dead_logger(scripts: Scripts) -> None:
    """With the logger dead, a worker's init() returns at once (it knows the pid is gone)
    instead of waiting for a welcome that cannot come; logging goes on."""
    res = scripts.run(PRELUDE + """
def child(q):
    t = time.monotonic()
    run = wf.init()
    run.log({"x": 1})
    q.put(time.monotonic() - t)

if __name__ == "__main__":
    funnel = wf.Funnel(project="t").start()
    os.kill(funnel.logger_pid, signal.SIGKILL)
    time.sleep(0.3)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,)); p.start()
    report(init_s=q.get(timeout=60))
    p.join(30)
    funnel.close()
""")
    assert res.returncode == 0, res.stderr
    assert reports(res.stdout)["init_s"] < 3


def test_remote_rank_heartbeats_and_death(scripts: Scripts) -> None:
    """A rank on another host (its pid means nothing to the logger) is kept alive by
    heartbeats while it is quiet, and declared gone a few seconds after it dies, so close()
    does not wait for it until the straggler deadline."""
    res = scripts.run(PRELUDE + """
def remote(ready, quiet_s, die):
    from wandb_funnel._worker import stream
    stream._HOSTNAME = "another-node"   # as if this rank ran elsewhere
    run = wf.init()
    run.log({"c": 0}, step=0)
    run.flush()
    ready.set()
    time.sleep(quiet_s)
    if die:
        os.kill(os.getpid(), signal.SIGKILL)
    run.log({"c": 1}, step=1)
    run.finish()

if __name__ == "__main__":
    funnel = wf.Funnel(project="t", close_timeout=60).start()
    ctx = mp.get_context("spawn")
    r1, r2 = ctx.Event(), ctx.Event()
    quiet = ctx.Process(target=remote, args=(r1, 8, False))
    dying = ctx.Process(target=remote, args=(r2, 0.5, True))
    quiet.start(); dying.start()
    r1.wait(60); r2.wait(60)
    t = time.monotonic()
    funnel.close()
    report(close_s=time.monotonic() - t, stats=funnel.stats)
    quiet.join(10); dying.join(10)
""", timeout=120)
    assert res.returncode == 0, res.stderr
    info = reports(res.stdout)
    assert info["stats"]["funnel/dead_ranks"] == 1  # the quiet one was not taken for dead
    assert info["close_s"] < 20  # well before the 24 s straggler deadline
    run = only_run(scripts.wandb_dir)
    assert run.column("c") == [(0, 0), (1, 1)]  # step 0 merged; the quiet rank's step 1 too
    assert res.leftovers == []


def test_close_with_a_row_backlog_keeps_its_deadline_and_accounting(scripts: Scripts) -> None:
    """More rows than wandb can write within close_timeout: close() still ends in time, and
    the run still gets its summary and exit record, with the rows that did not fit counted
    as dropped (records + dropped == sent)."""
    res = scripts.run(PRELUDE + """
def child():
    run = wf.init()
    for s in range(40000):
        run.log({"v": 1.0}, step=s)
    run.finish()

if __name__ == "__main__":
    funnel = wf.Funnel(project="t", close_timeout=6).start()
    p = mp.get_context("spawn").Process(target=child); p.start(); p.join(60)
    t = time.monotonic()
    funnel.close()
    report(close_s=time.monotonic() - t, stats=funnel.stats)
""", timeout=120)
    assert res.returncode == 0, res.stderr
    info = reports(res.stdout)
    assert info["close_s"] <= 6 + 1.5  # close_timeout, plus slack for a loaded CI machine
    stats = info["stats"]
    assert stats["funnel/records"] + stats["funnel/dropped_records"] == 40000
    run = only_run(scripts.wandb_dir)
    assert run.exit_code == 0
    assert run.summary["funnel/records"] == stats["funnel/records"] == len(run.history)
